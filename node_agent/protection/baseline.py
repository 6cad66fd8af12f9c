"""Bandwidth regressions: a self-test's GB/s figures against this node's last passing run.

The figures of every passing self-test are kept in ``--state-dir/self-test-baseline.json``
with the GPUs (their UUIDs) they were measured on; the next self-test's figure more than
``--bandwidth-drop-pct`` below its kept value fails its check (and so the verdict), and so
does a bandwidth the same check measured then and not now (a P2P path gone), and a check that
measured bandwidths then and is skipped now (its program gone). A run
that passes replaces the figures it measured (a level-1 run keeps the level-2 figures it did
not measure); other GPUs than the kept ones start the record over. Nothing kept, or kept
unreadably, means nothing to compare: the run passes or fails on its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

log = logging.getLogger("node_agent.baseline")

FILE: Final = "self-test-baseline.json"
MAX_BYTES: Final = 1024 * 1024
COMPARED_SUFFIX: Final = "_gbps"


class Baseline:
    """The last passing self-test's figures, and the comparison of a new run with them."""

    def __init__(self, state_dir: Path | None, drop_pct: float) -> None:
        """``state_dir`` None: nothing kept or compared; ``drop_pct`` 0: kept, not compared."""
        self.path = state_dir / FILE if state_dir is not None else None
        self.drop_pct = drop_pct

    def _kept(self, gpus: Sequence[str]) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            if self.path.stat().st_size > MAX_BYTES:
                raise ValueError(f"over {MAX_BYTES} bytes")
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except Exception as exc:  # whatever the file holds, the self-test goes on
            log.warning("%s cannot be read (%s): nothing to compare with", self.path, exc)
            return {}
        if not isinstance(doc, dict) or doc.get("gpus") != list(gpus):
            return {}
        checks = doc.get("checks")
        return doc if isinstance(checks, dict) else {}

    def judge(self, doc: dict[str, Any], gpus: Sequence[str]) -> dict[str, Any]:
        """``doc`` (a verdict document) with every figure compared; kept again if it passes.

        ``gpus``: the UUIDs of the node's GPUs in index order (other GPUs: a new record).
        """
        kept = self._kept(gpus)
        last = kept.get("checks", {})
        compared = 0
        checks = []
        for check in doc.get("checks") or []:
            before = last.get(check.get("name"))
            drops: list[str] = []
            if isinstance(before, dict) and self.drop_pct > 0:
                drops, n = self._drops(check, before)
                compared += n
            if drops:
                check = {
                    **check,
                    "outcome": "fail",
                    "detail": "; ".join([*drops, check.get("detail") or ""]).strip("; "),
                }
            checks.append(check)
        ran = [c for c in checks if c.get("outcome") != "skipped"]
        passed = doc.get("verdict") == "pass" and all(c.get("outcome") == "pass" for c in ran)
        judged = {
            **doc,
            "verdict": "pass" if passed else "fail",
            "checks": checks,
            "baseline": {"compared": compared, "since": kept.get("at")},
        }
        if passed:
            self._keep(checks, last, gpus)
        return judged

    def _drops(self, check: dict[str, Any], before: dict[str, Any]) -> tuple[list[str], int]:
        """What fails ``check`` against its figures at the last pass, and how many it compared."""
        kept = {k: v for k, v in before.items() if k.endswith(COMPARED_SUFFIX) and _number(v)}
        figures = check.get("figures") or {}
        if check.get("outcome") == "skipped":
            if not kept:
                return [], 0
            # The program is gone: what it measured is no longer verified.
            why = check.get("detail") or "skipped"
            return [f"not run ({why}); it measured {len(kept)} bandwidth(s) at this node's last "
                    "pass"], 0  # fmt: skip
        drops = []
        if check.get("outcome") == "pass":
            drops = [
                f"{k.removesuffix(COMPARED_SUFFIX)} not measured, {was:g} GB/s at this node's "
                "last pass"
                for k, was in kept.items()
                if k not in figures
            ]
        compared = 0
        for key, value in figures.items():
            was = kept.get(key)
            if was is None or not _number(value):
                continue
            compared += 1
            if value < was * (1 - self.drop_pct / 100):
                pct = 100 * (1 - value / was)
                drops.append(
                    f"{key.removesuffix(COMPARED_SUFFIX)} {value:g} GB/s is {pct:.0f}% "
                    f"below this node's last pass ({was:g} GB/s)"
                )
        return drops, compared

    def _keep(
        self, checks: Sequence[dict[str, Any]], last: dict[str, Any], gpus: Sequence[str]
    ) -> None:
        if self.path is None:
            return
        measured = {
            c["name"]: c["figures"]
            for c in checks
            if c.get("outcome") == "pass" and c.get("figures") and isinstance(c.get("name"), str)
        }
        if not measured:
            return
        doc = {
            "gpus": list(gpus),
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            "checks": {**last, **measured},
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with tmp.open("w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except (OSError, ValueError) as exc:
            log.warning("cannot keep the self-test's figures in %s: %s", self.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def _number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
