"""List-then-watch loops (reflectors) that keep a cache in step with the API server.

A reflector lists, hands the full set to ``on_replace``, then watches from the list's
resourceVersion, handing each event to ``on_event`` and following bookmarks. A dropped stream
is resumed from the last resourceVersion seen; 410 Gone (history compacted) means list again;
any other failure backs off (bounded, jittered) and lists again. It runs in its own thread; the
callbacks run there too, so consumers hand the data to their event loop themselves.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from scheduler_extender.k8s.client import Gone, JsonDict, KubeError

log = logging.getLogger("scheduler_extender.k8s")

Lister = Callable[[], "tuple[list[JsonDict], str]"]
Watcher = Callable[[str, int], "Iterator[JsonDict]"]


class Reflector:
    """One resource's list+watch loop."""

    def __init__(
        self,
        name: str,
        lister: Lister,
        watcher: Watcher,
        on_replace: Callable[[list[JsonDict]], None],
        on_event: Callable[[str, JsonDict], None],
        *,
        watch_timeout_s: int = 300,
        max_backoff_s: float = 30.0,
        on_restart: Callable[[str], Any] | None = None,
    ) -> None:
        self.name = name
        self._list = lister
        self._watch = watcher
        self._on_replace = on_replace
        self._on_event = on_event
        self._timeout = watch_timeout_s
        self._max_backoff = max_backoff_s
        self._on_restart = on_restart
        self._stop = threading.Event()
        self.synced = threading.Event()
        self.resource_version = ""
        self.relists = 0
        self._thread = threading.Thread(target=self._run, name=f"reflector-{name}", daemon=True)

    def start(self) -> None:
        """Start listing and watching in the background."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the loop to end (it ends at the next event or watch timeout)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                items, rv = self._list()
                self.relists += 1
                self._on_replace(items)
                self.resource_version = rv
                self.synced.set()
                failures = 0
                self._watch_until_gone()
            except Gone:
                log.info("%s: watch history expired (410); listing again", self.name)
                self._restarted("gone")
            except KubeError as exc:
                failures += 1
                delay = min(self._max_backoff, 0.5 * 2**failures) * random.uniform(0.5, 1.0)
                log.warning("%s: %s; retrying in %.1f s", self.name, exc, delay)
                self._restarted("error")
                self._stop.wait(delay)
            except Exception:
                failures += 1
                log.exception("%s: unexpected error in the watch loop", self.name)
                self._restarted("error")
                self._stop.wait(min(self._max_backoff, 0.5 * 2**failures))

    def _restarted(self, why: str) -> None:
        if self._on_restart is not None:
            self._on_restart(why)

    def _watch_until_gone(self) -> None:
        while not self._stop.is_set():
            for event in self._watch(self.resource_version, self._timeout):
                kind = event.get("type", "")
                obj = event.get("object") or {}
                rv = str(obj.get("metadata", {}).get("resourceVersion", ""))
                if rv:
                    self.resource_version = rv
                if kind != "BOOKMARK":
                    self._on_event(kind, obj)
                if self._stop.is_set():
                    return
            # The stream ended (timeout or dropped): resume from the last version seen.
