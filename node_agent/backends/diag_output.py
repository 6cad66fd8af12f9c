"""What the GPU diagnostic tools print, read into checks: pass/fail, why, and the figures.

Pure functions of (check name, exit status, output), one per tool, tested with recorded outputs
of the real tools (tests/agent/fixtures/regression). A parser is strict about what it needs to
call a pass: the tool's own success line or document, not merely exit status 0. Imports only
the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final


@dataclass(frozen=True, slots=True)
class Check:
    """One result of the self-test."""

    name: str
    outcome: str
    """``pass``, ``fail`` or ``skipped``."""
    detail: str = ""
    duration_s: float = 0.0
    figures: dict[str, float] = field(default_factory=dict)
    """Measured numbers; those named ``*_gbps`` are bandwidths compared across runs."""


Parse = Callable[[str, int, str], list[Check]]
"""(check name, exit status, output) → the checks it shows."""

DETAIL_LIMIT: Final = 500


def tail(text: str, lines: int = 3) -> str:
    """The last lines of an output, on one line."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[:DETAIL_LIMIT]


def _check(name: str, ok: bool, detail: str, figures: dict[str, float] | None = None) -> Check:
    return Check(name, "pass" if ok else "fail", detail[:DETAIL_LIMIT], figures=figures or {})


def exit_status(name: str, code: int, text: str) -> list[Check]:
    """A tool judged by its exit status (the diagnostics have parsers of their own)."""
    return [_check(name, code == 0, f"exit {code}: {tail(text)}")]


# -- CUDA samples ---------------------------------------------------------------------------

RESULT: Final = re.compile(r"^\s*Result\s*=\s*(PASS|FAIL|WAIVED)\b", re.MULTILINE)
"""The CUDA samples' last line."""


def _result(text: str) -> str | None:
    found = RESULT.findall(text)
    return found[-1] if found else None


def device_query(name: str, code: int, text: str, expected: int = 0) -> list[Check]:
    """deviceQuery: ``Result = PASS`` and at least the ``expected`` devices detected."""
    result = _result(text)
    count = re.search(r"Detected (\d+) CUDA Capable device", text)
    figures = {"devices": float(count.group(1))} if count else {}
    if code == 0 and result == "PASS" and count:
        seen = int(count.group(1))
        if seen < expected:
            return [_check(name, False, f"{seen} CUDA device(s) of {expected} GPUs", figures)]
        return [_check(name, True, f"{seen} CUDA device(s)", figures)]
    reason = re.search(r"^(cuda\w+ returned .*)$", text, re.MULTILINE)
    why = reason.group(1) if reason else tail(text)
    return [_check(name, False, f"exit {code}, Result = {result or 'missing'}: {why}", figures)]


def vector_add(name: str, code: int, text: str) -> list[Check]:
    """vectorAdd: ``Test PASSED``."""
    if code == 0 and re.search(r"^Test PASSED\b", text, re.MULTILINE):
        return [_check(name, True, "Test PASSED")]
    return [_check(name, False, f"exit {code}: {tail(text)}")]


_DIRECTIONS: Final = {
    "Host to Device": "h2d",
    "Device to Host": "d2h",
    "Device to Device": "d2d",
}
_SECTION: Final = re.compile(r"^\s*(Host to Device|Device to Host|Device to Device) Bandwidth\b")
_UNIT: Final = re.compile(r"Bandwidth\((GB|MB)/s\)")
_ROW: Final = re.compile(r"^\s*(\d+)\s+([0-9]+(?:\.[0-9]+)?)\s*$")


def bandwidth_test(name: str, code: int, text: str) -> list[Check]:
    """bandwidthTest: ``Result = PASS`` and GB/s host→device, device→host, device→device.

    The figure of a direction is its largest transfer's (quick mode measures one size);
    outputs in MB/s (older samples, MiB/s in fact) are converted.
    """
    figures: dict[str, float] = {}
    direction = None
    scale = 1.0
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            direction = _DIRECTIONS[section.group(1)]
            continue
        unit = _UNIT.search(line)
        if unit:
            scale = 1.0 if unit.group(1) == "GB" else 1.048576e-3  # MiB/s
            continue
        row = _ROW.match(line)
        if row and direction is not None:
            figures[f"{direction}_gbps"] = round(float(row.group(2)) * scale, 3)
    result = _result(text)
    shown = ", ".join(f"{k.removesuffix('_gbps')} {v:g} GB/s" for k, v in figures.items())
    ok = code == 0 and result == "PASS" and "h2d_gbps" in figures and "d2h_gbps" in figures
    detail = shown if ok else f"exit {code}, Result = {result}: {tail(text)}"
    return [_check(name, ok, detail, figures)]


_MATRIX: Final = re.compile(r"^\s*(Unidirectional|Bidirectional) P2P=(Enabled|Disabled) Bandwidth")


def p2p_bandwidth(name: str, code: int, text: str) -> list[Check]:
    """p2pBandwidthLatencyTest: every GPU pair's bidirectional bandwidth with P2P enabled.

    Figures ``p2p_<i>_<j>_gbps`` (i < j, the lower of its two cells) from the
    "Bidirectional P2P=Enabled Bandwidth Matrix (GB/s)".
    """
    cells: dict[tuple[int, int], float] = {}
    taking = False
    for line in text.splitlines():
        matrix = _MATRIX.match(line)
        if matrix:
            taking = matrix.group(1) == "Bidirectional" and matrix.group(2) == "Enabled"
            continue
        if not taking:
            continue
        parts = line.split()
        if not parts or parts[0] == "D\\D":
            continue
        if not parts[0].isdigit():
            taking = False
            continue
        row = int(parts[0])
        for col, value in enumerate(parts[1:]):
            try:
                cells[row, col] = float(value)
            except ValueError:
                break
    figures: dict[str, float] = {}
    for (i, j), gbps in sorted(cells.items()):
        if i < j and (j, i) in cells:
            figures[f"p2p_{i}_{j}_gbps"] = min(gbps, cells[j, i])
    if code == 0 and figures:
        low = min(figures, key=figures.__getitem__)
        pair = low.removeprefix("p2p_").removesuffix("_gbps").replace("_", "-")
        said = f"{len(figures)} pair(s), lowest {pair} {figures[low]:g} GB/s"
        return [_check(name, True, said, figures)]
    return [_check(name, False, f"exit {code}, no P2P bandwidth matrix: {tail(text)}", figures)]


# -- DCGM -----------------------------------------------------------------------------------


def _load(text: str) -> Any:
    """The first JSON object in an output that may carry lines before (or after) it."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            doc, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            start = text.find("{", start + 1)
            continue
        if isinstance(doc, dict):
            return doc
        start = text.find("{", start + 1)
    raise ValueError("no JSON document")


_STATUS: Final = {"pass": "pass", "fail": "fail", "warn": "fail", "skip": "skipped"}
"""A DCGM result status → an outcome. A warning fails: a node must pass clean to take work."""

_PCIE: Final = re.compile(
    r"GPU (\d+)(?: GPU \d+)? (GPU to Host|Host to GPU|bidirectional) bandwidth:\s*"
    r"([0-9.]+) GB/s"
)
_PCIE_KEYS: Final = {"GPU to Host": "d2h", "Host to GPU": "h2d", "bidirectional": "bidir"}


def _outcome(status: object) -> str | None:
    word = str(status or "").strip().split(" ")[0].lower()
    return _STATUS.get(word)


def _messages(result: dict[str, Any]) -> list[str]:
    said = []
    for key in ("warnings", "warning"):
        value = result.get(key)
        items = value if isinstance(value, list) else [value] if value else []
        for item in items:
            text = item.get("warning") if isinstance(item, dict) else item
            if text:
                said.append(" ".join(str(text).split()))
    return said


def _gpu_of(result: dict[str, Any]) -> str:
    for key in ("entity_id", "gpu_id", "gpu_ids"):
        if key in result and result[key] not in (None, ""):
            return str(result[key])
    return ""


def _pcie_figures(text: str) -> dict[str, float]:
    return {
        f"pcie_gpu{gpu}_{_PCIE_KEYS[what]}_gbps": float(value)
        for gpu, what, value in _PCIE.findall(text)
    }


def _dcgm_test(prefix: str, test: dict[str, Any]) -> Check:
    """One test of a ``dcgmi diag -j`` document: failed when any GPU's result is."""
    outcomes: list[str] = []
    failed: list[str] = []
    figures: dict[str, float] = {}
    for result in test.get("results") or []:
        if not isinstance(result, dict):
            continue
        outcome = _outcome(result.get("status")) or "fail"
        outcomes.append(outcome)
        info = result.get("info")
        figures.update(_pcie_figures(" ".join(info) if isinstance(info, list) else str(info or "")))
        if outcome == "fail":
            gpu = _gpu_of(result)
            said = "; ".join(_messages(result)) or str(result.get("status"))
            failed.append(f"GPU {gpu}: {said}" if gpu else said)
    summary = _outcome((test.get("test_summary") or {}).get("status"))
    if summary == "fail" and not failed:
        failed.append("test summary: Fail")
    name = f"{prefix}/{test.get('name')}"
    if failed:
        return Check(name, "fail", "; ".join(failed)[:DETAIL_LIMIT], figures=figures)
    if not outcomes or all(o == "skipped" for o in outcomes):
        return Check(name, "skipped", "skipped by DCGM", figures=figures)
    return _check(name, True, "", figures)


def _dcgm_document(name: str, code: int, doc: Any) -> list[Check]:
    if not isinstance(doc, dict):
        raise ValueError("not a dcgmi diag document")
    body = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic")
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        raise ValueError("no test_categories in the dcgmi diag document")
    checks = [
        _dcgm_test(name, test)
        for category in body["test_categories"]
        if isinstance(category, dict)
        for test in category.get("tests") or []
        if isinstance(test, dict)
    ]
    if not checks:
        raise ValueError("no tests in the dcgmi diag document")
    if code != 0 and all(c.outcome != "fail" for c in checks):
        checks.append(_check(name, False, f"exit {code} with no failed test"))
    return checks


_ROW_CELLS: Final = re.compile(r"^\|\s*(.*?)\s*\|(.*)\|\s*$")


def _segment(raw: str) -> str:
    """A wrapped cell's piece of text: DCGM cuts at a fixed width (mid-word), two pads after."""
    return raw[1:-2] if len(raw) > 3 else raw.strip()


def _dcgm_table(name: str, code: int, text: str) -> list[Check]:
    """The box-drawn table ``dcgmi diag`` prints without ``-j`` (DCGM 3 and 4)."""
    tests: list[tuple[str, str, list[str]]] = []
    in_metadata = False
    for line in text.splitlines():
        if line.startswith(("|-----", "+-----")):
            in_metadata = "Metadata" in line
            continue
        cells = _ROW_CELLS.match(line)
        if not cells or in_metadata:
            continue
        left, raw = cells.groups()
        right = raw.strip()
        if left == "Diagnostic":
            continue
        if left and left not in ("Warning", "Info"):
            outcome = _outcome(right)
            if outcome is not None:
                tests.append((left, outcome, []))
            continue
        if tests and left == "Warning":
            tests[-1][2].append(_segment(raw))
        elif tests and not left and tests[-1][2] and not re.match(r"GPU\d+: ", right):
            tests[-1][2][-1] += _segment(raw)
    if not tests:
        return [_check(name, False, f"exit {code}, no dcgmi diag result: {tail(text)}")]
    checks = [
        Check(f"{name}/{test}", outcome, " ".join(" | ".join(said).split())[:DETAIL_LIMIT])
        for test, outcome, said in tests
    ]
    if code != 0 and all(c.outcome != "fail" for c in checks):
        checks.append(_check(name, False, f"exit {code} with no failed test"))
    return checks


def dcgmi(name: str, code: int, text: str) -> list[Check]:
    """``dcgmi diag -r N -j``: one check per test (DCGM 3 and 4 documents; tables too).

    A test fails when any GPU's result is Fail or Warn, with DCGM's warnings as the detail;
    Skip is skipped. The PCIe test's bandwidths become ``pcie_gpu<i>_{h2d,d2h,bidir}_gbps``.
    Neither a document nor a table (DCGM not running, an error message) is a failure.
    """
    try:
        return _dcgm_document(name, code, _load(text))
    except ValueError:
        return _dcgm_table(name, code, text)


# -- AMD ------------------------------------------------------------------------------------

_RVS_SUMMARY: Final = re.compile(r"^\|\s*(\S+)\s*\|\s*([A-Z]+)\s*\|\s*(PASS|FAIL)\s*\|\s*$")
_RVS_VERDICT: Final = re.compile(r"\[(\S+?)\].*?(?:pass|met):\s*(TRUE|FALSE)", re.IGNORECASE)
_PEBB: Final = re.compile(
    r"^\[RESULT\].*?pcie-bandwidth\s+\[\s*\d+/\d+\]\s+"
    r"(?:\[CPU::\s*(\d+)\]\s+\[GPU::\s*\d+\s*-\s*\d+\s*-\s*([0-9a-fA-F:.]+)\s*\]|(\d+)\s+(\d+))\s+"
    r"h2d:+\s*(true|false)\s+d2h:+\s*(true|false)\s+([0-9.]+)\s*GBps",
    re.MULTILINE,
)


def rvs(name: str, code: int, text: str) -> list[Check]:
    """The ROCm Validation Suite (``rvs -r N``, or a ``-c`` conf): its actions' verdicts.

    Fails on exit status, a ``pass: FALSE`` / ``met: FALSE`` line or a FAIL row of the summary;
    a pass needs one passing verdict (or PEBB bandwidths). PCIe bandwidths (PEBB) become
    ``pebb_gpu<bdf>_cpu<n>_{h2d,d2h,bidir}_gbps`` (older RVS: its GPU id for the bdf).
    """
    failed: list[str] = []
    passed = 0
    for line in text.splitlines():
        summary = _RVS_SUMMARY.match(line)
        verdict = None if summary else _RVS_VERDICT.search(line)
        if summary:
            action, module, result = summary.groups()
            if result == "FAIL":
                failed.append(f"{action} ({module}) FAIL")
            else:
                passed += 1
        elif verdict and line.startswith("[RESULT]"):
            if verdict.group(2).upper() == "FALSE":
                failed.append(line.split("]", 2)[-1].strip())
            else:
                passed += 1
    figures = {}
    for cpu, gpu, cpu_old, gpu_old, h2d, d2h, value in _PEBB.findall(text):
        way = "bidir" if h2d == d2h == "true" else "h2d" if h2d == "true" else "d2h"
        where = gpu.replace(":", "-").replace(".", "-") if gpu else gpu_old
        figures[f"pebb_gpu{where}_cpu{cpu or cpu_old}_{way}_gbps"] = float(value)
    if code == 0 and (passed or figures) and not failed:
        said = f"{passed} verdict(s) passed" if passed else f"{len(figures)} bandwidth(s)"
        return [_check(name, True, said, figures)]
    why = "; ".join(dict.fromkeys(failed)) or f"no verdict: {tail(text)}"
    return [_check(name, False, f"exit {code}: {why}", figures)]


_RBT_MATRIX: Final = re.compile(r"^\s*(Unidirectional|Bidirectional) copy peak bandwidth GB/s")


def rocm_bandwidth(name: str, code: int, text: str) -> list[Check]:
    """rocm-bandwidth-test's peak copy bandwidth matrices, device to device.

    Figures ``rbt_{uni,bi}_<i>_<j>_gbps`` for every measured cell (``N/A`` is not measured;
    a cell measured at the last pass and N/A now fails in the baseline comparison).
    """
    figures: dict[str, float] = {}
    matrix = None
    columns: list[str] = []
    for line in text.splitlines():
        head = _RBT_MATRIX.match(line)
        if head:
            matrix, columns = ("uni" if head.group(1) == "Unidirectional" else "bi"), []
            continue
        parts = line.split()
        if matrix is None or not parts:
            continue
        if parts[0] == "D/D":
            columns = parts[1:]
            continue
        if not parts[0].isdigit() or not columns:
            matrix = None
            continue
        for col, value in zip(columns, parts[1:], strict=False):
            if col != parts[0] and re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", value):
                figures[f"rbt_{matrix}_{parts[0]}_{col}_gbps"] = float(value)
    if code == 0 and figures:
        return [_check(name, True, f"{len(figures)} copy path(s) measured", figures)]
    return [_check(name, False, f"exit {code}, no bandwidth matrix: {tail(text)}", figures)]


# -- Intel ----------------------------------------------------------------------------------

_XPU_BANDWIDTH: Final = re.compile(r"(?:GPU (\d+) :.*?)?memory bandwidth is\s+([0-9.]+)\s*GBPS")


def _unconfigured(said: list[str]) -> bool:
    """A performance item failed only for want of a configured threshold (not a fault)."""
    return "unconfigured or invalid threshold" in " ".join(" ".join(said).split()).lower()


def xpu_diag(name: str, code: int, text: str) -> list[Check]:
    """``xpu-smi diag -d N -l L``: the table's overall result and each item's.

    Fails on exit status, an overall ``Result | Fail`` or an item's ``Result: Fail`` (with its
    message); a pass needs a Pass. A performance item that fails only because xpu-smi has no
    threshold configured ("Unconfigured or invalid threshold") passes with its figure, which the
    node's last pass then judges. The memory bandwidth becomes ``memory_gbps`` (per GPU:
    ``memory_gpu<i>_gbps``).
    """
    items: list[tuple[str, str, list[str]]] = []
    overall = None
    for line in text.splitlines():
        cells = _ROW_CELLS.match(line)
        if not cells:
            continue
        left, right = cells.group(1), cells.group(2).strip()
        if left == "Result":
            overall = right.split()[0].lower() if right else None
            continue
        result = re.match(r"Result:\s*(\w+)", right)
        if left and result:
            items.append((left, result.group(1).lower(), []))
        elif items and right:
            items[-1][2].append(right.removeprefix("Message:").strip())
    failed = [
        f"{item}: {' '.join(' '.join(said).split())}".strip(": ")
        for item, result, said in items
        if result != "pass" and not _unconfigured(said)
    ]
    joined = " ".join(" ".join(said) for _, _, said in items)
    figures = {}
    for gpu, value in _XPU_BANDWIDTH.findall(" ".join(joined.split())):
        figures[f"memory_gpu{gpu}_gbps" if gpu else "memory_gbps"] = float(value)
    if overall == "fail" and not failed and not any(_unconfigured(said) for _, _, said in items):
        failed.append("Result: Fail")
    passed = [i for i, r, said in items if r == "pass" or _unconfigured(said)]
    ok = code == 0 and not failed and (overall == "pass" or bool(passed))
    detail = f"{len(items)} item(s) passed" if ok else "; ".join(failed) or tail(text)
    return [_check(name, ok, f"exit {code}: {detail}" if not ok else detail, figures)]
