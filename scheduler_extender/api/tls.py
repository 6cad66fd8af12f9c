"""The HTTPS server's TLS context, rebuilt from its certificate files when they change.

uvicorn loads the certificate, key and client CA once; ``ServingTls`` hands new handshakes the
context last built from the files, so a renewed certificate or CA is served without a restart.
Standard library only.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("scheduler_extender")

TLS_RELOAD_INTERVAL_S = 60.0
"""How often the certificate, key and client CA files are read for a change (kubelet brings a
changed Secret into a Pod within a minute or two, and cert-manager renews long before expiry)."""


def certificate_not_after(path: Path) -> float | None:
    """When the first certificate of a PEM file expires, in Unix seconds; None if unknown.

    The standard library decodes a certificate file only with a private helper of ``_ssl``
    (the one ``ssl``'s own tests use); where it is missing or fails, None.
    """
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        return float(ssl.cert_time_to_seconds(decode(str(path))["notAfter"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ServingTls:
    """The HTTPS server's TLS context, rebuilt from its files when they change.

    uvicorn loads the certificate, key and client CA once. The context it is given here
    (``context``) hands every new handshake the context last built from the files, through its
    SNI callback (called for each handshake, with or without a server name), so a renewed
    certificate or CA is served without a restart; connections already open keep theirs. A new
    context is built whole before it is used: files that do not load (a key that is not the
    certificate's, a half-written file) leave the one in use as it was, and a CA taken out of
    the file is trusted no more (contexts are replaced, never added to).

    ``reload_if_changed`` compares the files' contents (kubelet updates a mounted Secret by
    swapping a symlink, which leaves the paths and may leave their times as they were);
    ``start`` calls it every ``interval_s`` in a thread. ``on_expiry`` is told the serving
    certificate's notAfter (Unix seconds) at start and after each reload.
    """

    def __init__(
        self,
        cert_file: Path,
        key_file: Path,
        client_ca_file: Path | None = None,
        *,
        on_expiry: Callable[[float], None] | None = None,
        interval_s: float = TLS_RELOAD_INTERVAL_S,
    ) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._client_ca_file = client_ca_file
        self._on_expiry = on_expiry
        self._interval_s = interval_s
        self._seen = self._fingerprint()
        """What the files held when last read (or why they could not be read)."""
        self.context = self._build()
        """The context uvicorn serves with; its handshakes move to ``_current``."""
        self.context.sni_callback = self._choose
        self._current = self.context
        self._report_expiry()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def uvicorn_options(self) -> dict[str, Any]:
        """What to give uvicorn so that it serves with ``context``."""
        return {"ssl_context_factory": self._factory}

    def _factory(self, _config: Any, _default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        return self.context

    def _files(self) -> list[Path]:
        files = [self._cert_file, self._key_file]
        return files if self._client_ca_file is None else [*files, self._client_ca_file]

    def _fingerprint(self) -> bytes:
        digest = hashlib.sha256()
        for path in self._files():
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.digest()

    def _build(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # No session resumption: a resumed session skips the certificate check, so a client of
        # a CA taken out of ca.crt could go on resuming what it had before the reload. TLS 1.3
        # resumes with tickets only (none are issued); TLS 1.2 would resume from the server's
        # session cache, which Python cannot turn off. Every client here speaks TLS 1.3.
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.options |= ssl.OP_NO_TICKET
        context.num_tickets = 0
        context.load_cert_chain(self._cert_file, self._key_file)
        if self._client_ca_file is not None:
            # Optional at the TLS layer (agents push with a token and no certificate); a
            # certificate that is presented must be the CA's, and the verbs check its names.
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_verify_locations(self._client_ca_file)
        return context

    def _choose(
        self, connection: ssl.SSLObject, _server_name: str | None, context: ssl.SSLContext
    ) -> None:
        current = self._current
        if current is not context:
            connection.context = current

    def _report_expiry(self) -> float | None:
        not_after = certificate_not_after(self._cert_file)
        if not_after is None:
            log.warning("TLS: cannot read when %s expires: no expiry exported", self._cert_file)
        elif self._on_expiry is not None:
            self._on_expiry(not_after)
        return not_after

    def reload_if_changed(self) -> bool:
        """Serve a context built from the files if they changed; True when one now is."""
        try:
            seen = self._fingerprint()
        except OSError as exc:
            seen = f"unreadable: {exc}".encode()
            if seen != self._seen:
                self._seen = seen
                log.warning("TLS: cannot read the certificate files (%s): still serving the "
                            "certificate loaded before", exc)  # fmt: skip
            return False
        if seen == self._seen:
            return False
        self._seen = seen
        try:
            context = self._build()
        except OSError as exc:  # ssl.SSLError among them
            log.warning("TLS: cannot load the changed certificate files (%s): still serving the "
                        "certificate loaded before", exc)  # fmt: skip
            return False
        self._current = context
        not_after = self._report_expiry()
        until = "" if not_after is None else f", valid until {_utc(not_after)}"
        log.info("TLS: reloaded %s for new connections%s", self._cert_file, until)
        return True

    def start(self) -> None:
        """Look for changed files every ``interval_s``, in a thread, until ``stop``."""
        self._thread = threading.Thread(target=self._watch, name="tls-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop looking (and wait for the thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.reload_if_changed()
            except Exception:  # the watch outlives whatever one look ran into
                log.exception("TLS: looking for changed certificate files failed")


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
