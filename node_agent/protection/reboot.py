"""The reboot sentinel: written when the extender asks for a reboot, withdrawn when it stops.

kured (``--reboot-sentinel``) and similar tools reboot a node while the file exists. The agent
writes it only for an ask that names its current boot, never overwrites or deletes a file
another tool wrote, and withdraws its own once the asks stop. Imports the standard library and
the push answer's ``Ask``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from node_agent.uplink.answer import Ask

log = logging.getLogger("node_agent")

DEFAULT_SENTINEL = Path("/var/run/edgegpu/reboot-required")
"""Ours alone (``/var/run/reboot-required`` is unattended-upgrades' too): point kured's
``--reboot-sentinel`` here."""
WITHDRAW_AFTER_ROUNDS = 3
"""Rounds in which every extender answered without the ask before the sentinel is withdrawn.

One answer without it proves nothing: a follower replica never asks, and the leader may be
out of reach for a round or two (a round it does not answer is not counted)."""
_FIRST_LINE = "edgegpu remediation "
Refused = Literal["no-boot", "other-boot"]
"""Why a reboot ask was not followed: it named no boot, or another boot than this one."""


@dataclass(frozen=True, slots=True)
class Written:
    """What a sentinel of ours says: the request, and the boot it was written in."""

    request: str
    boot: str | None


def content(request: str, boot: str) -> str:
    """The sentinel's text: our mark and the request id, then the boot it was written in."""
    return f"{_FIRST_LINE}{request}\nboot {boot}\n"


def parse(text: str) -> Written | None:
    """The request and boot of a sentinel the agent wrote; None for any other file.

    An older agent wrote the first line only.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not 1 <= len(lines) <= 2 or not lines[0].startswith(_FIRST_LINE):
        return None
    request = lines[0].removeprefix(_FIRST_LINE)
    if not request or any(c.isspace() for c in request):
        return None
    if len(lines) == 1:
        return Written(request, None)
    boot = lines[1].removeprefix("boot ")
    if not lines[1].startswith("boot ") or not boot or any(c.isspace() for c in boot):
        return None
    return Written(request, boot)


class RebootSentinel:
    """The sentinel file as this agent handles it, one round at a time (``follow``)."""

    def __init__(
        self, path: Path | None, *, withdraw_after_rounds: int = WITHDRAW_AFTER_ROUNDS
    ) -> None:
        self.path = path
        self.withdraw_after_rounds = withdraw_after_rounds
        self.held: Written | None = None
        """The sentinel this agent wrote (or found from before its restart) and may withdraw."""
        self._started = False
        self._done: str | None = None
        """The request last acted on: written, or left to another tool's sentinel."""
        self._absent = 0
        """Rounds in a row in which every extender answered without the ask."""
        self._said: set[str] = set()
        """What was logged already, so that a standing ask is not logged every round."""

    def follow(self, ask: Ask | None, boot: str, every_replica_answered: bool) -> Refused | None:
        """One round's answers; why the ask was refused, if it was.

        ``ask`` is their reboot ask (None: none asked, or no answer), ``boot`` the boot this
        agent reports (the host's, else its own). An ask must name that boot: one that names
        another, or none, is refused (and a sentinel held is withdrawn), since nothing else
        shows that the decision was made for the node as it is now.
        """
        if not self._started:
            self._started = True
            self._adopt(boot)
        if ask is not None and ask.boot != boot:
            refused: Refused = "no-boot" if ask.boot is None else "other-boot"
            self._once(
                f"refused:{ask.id}:{ask.boot}",
                "reboot %s was decided for boot %s, this is boot %s: not asked of kured",
                ask.id, ask.boot or "(none named)", boot,
            )  # fmt: skip
            if self.held is not None:
                self._withdraw(f"the reboot ask names boot {ask.boot or '(none)'}, not this one")
            return refused
        if ask is not None:
            self._absent = 0
            if ask.id != self._done:
                self._write(ask.id, boot)
            return None
        if self.held is None:
            return None
        if every_replica_answered:
            self._absent += 1
        if self._absent >= self.withdraw_after_rounds:
            self._withdraw(f"no extender asked for it in {self._absent} rounds")
        return None

    # -- the file ---------------------------------------------------------------------------
    def _adopt(self, boot: str) -> None:
        """Take up a sentinel of ours from before a restart.

        Withdrawn at once if another boot wrote it (the reboot it asked for happened), else
        held as if written now.
        """
        found = self._read()
        if found is None:
            return
        self.held, self._done = found, found.request
        if found.boot is not None and found.boot != boot:
            self._withdraw(f"it was written in boot {found.boot}, this is boot {boot}")

    def _read(self) -> Written | None:
        if self.path is None:
            return None
        try:
            return parse(self.path.read_text(encoding="utf-8", errors="replace")[:4096])
        except OSError:
            return None

    def _write(self, request: str, boot: str) -> None:
        if self.path is None:
            self._done = request
            log.error("the extender decided this node must reboot (%s); no sentinel set", request)
            return
        text = content(request, boot).encode()
        try:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                if self._read() is None:
                    self._done, self.held = request, None
                    log.warning(
                        "the extender decided this node must reboot (%s); %s exists already "
                        "and is not ours: a reboot is asked already, the file is left as is",
                        request, self.path,
                    )  # fmt: skip
                    return
                self._replace(text)  # ours, for an earlier request
            else:
                with os.fdopen(fd, "wb") as f:
                    f.write(text)
        except OSError as exc:
            self._once(f"write:{request}:{exc.strerror}",
                       "reboot requested (%s): cannot write %s: %s; trying again each round",
                       request, self.path, exc.strerror)  # fmt: skip
            return
        self._done, self.held, self._absent = request, Written(request, boot), 0
        log.error("the extender decided this node must reboot (%s): wrote %s", request, self.path)

    def _replace(self, text: bytes) -> None:
        assert self.path is not None
        temp = self.path.with_name(f".{self.path.name}.tmp")
        temp.write_bytes(text)
        os.replace(temp, self.path)

    def _withdraw(self, why: str) -> None:
        """Delete the sentinel, if it is still the one held (another tool's stays)."""
        held, self.held, self._done, self._absent = self.held, None, None, 0
        if self.path is None or held is None:
            return
        if self._read() != held:
            log.warning("not withdrawing %s (%s): it is no longer the one written", self.path, why)
            return
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.held = held  # tried again after as many rounds
            log.error("cannot withdraw the reboot sentinel %s: %s", self.path, exc.strerror)
            return
        log.warning("reboot %s withdrawn (%s): removed %s", held.request, why, self.path)

    def _once(self, key: str, message: str, *args: object) -> None:
        if len(self._said) >= 256:  # asks with ever new ids: said again rather than kept
            self._said.clear()
        if key not in self._said:
            self._said.add(key)
            log.warning(message, *args)
