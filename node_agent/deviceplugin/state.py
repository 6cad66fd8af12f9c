"""What the agent keeps across its restarts: the memory block size the extender last said.

One small JSON file per node in ``--state-dir``, replaced atomically (a temporary file, then a
rename); a file that is absent or cannot be read is no state. Imports the standard library and
``model`` only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from node_agent.model import DEFAULT_BLOCK_MIB, MAX_BLOCK_MIB, MIN_BLOCK_MIB

log = logging.getLogger("node_agent")


class StateFile:
    """``<folder>/agent-<node>.json``.

    One file per node, so that simulated agents sharing a machine keep their own.
    """

    def __init__(self, folder: Path, node: str) -> None:
        self.path = folder / f"agent-{node.replace('/', '_')}.json"

    def block_mib(self) -> int | None:
        """The block size saved last; None (and why, logged) when there is none to trust."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            log.warning("state %s cannot be read (%s): not used", self.path, exc)
            return None
        value = doc.get("block_mib") if isinstance(doc, dict) else None
        if not isinstance(value, int) or isinstance(value, bool):
            value = None
        if value is None or not MIN_BLOCK_MIB <= value <= MAX_BLOCK_MIB:
            shown = doc.get("block_mib") if isinstance(doc, dict) else None
            log.warning("state %s: block_mib %r is not a block size: not used", self.path, shown)
            return None
        return value

    def save_block_mib(self, block_mib: int) -> bool:
        """Keep ``block_mib`` for the next start; False (logged) when it cannot be written."""
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with temp.open("w", encoding="utf-8") as f:
                json.dump({"block_mib": block_mib}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
        except OSError as exc:
            log.warning("state %s cannot be written: %s", self.path, exc)
            with contextlib.suppress(OSError):
                temp.unlink(missing_ok=True)
            return False
        return True


def starting_block_mib(saved: int | None, flag: int | None) -> tuple[int, str]:
    """The block size to advertise until an extender answers, and where it comes from.

    The extender's last word (kept in the state file) first: it is what kube-scheduler's
    count of the node's blocks was made with; else ``--block-mib``; else the policy's default.
    """
    if saved is not None:
        return saved, "the extender's policy, as the state file kept it"
    if flag is not None:
        return flag, "--block-mib"
    return DEFAULT_BLOCK_MIB, "the policy's default"
