"""Writes the reading fields of the telemetry structs from the field table (``make generate``).

``scheduler_extender/telemetry/fields.py`` declares each per-GPU reading once: name, type,
bounds. Three definitions of a reported GPU carry those readings, each for its own reader, and
each inherits them from a module written here, as protobuf stubs are written from a ``.proto``:

- ``scheduler_extender/telemetry/readings.py``: the pydantic base of the contract's
  ``schema.GpuReport`` (imported by the agent too: pydantic only);
- ``scheduler_extender/telemetry/readings_msgspec.py``: the msgspec base of the hot path's
  ``report.GpuReport`` (the agent never imports msgspec, so never this module);
- ``node_agent/readings.py``: the dataclass base of the agent's ``model.GpuReading``.

Source, not classes built at run time: mypy sees every attribute. ``python -m tools.gen_fields``
writes them; ``--check`` says which differ from what the table gives and exits 1. A test keeps
the committed modules equal to this output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from scheduler_extender.telemetry.fields import REPORTED, GpuField

ROOT = Path(__file__).resolve().parent.parent
_CLASS_DOC = "Each reading of one GPU at one moment; None where its backend could not read it."
HEADER = "# Generated from scheduler_extender/telemetry/fields.py by `make generate`: do not edit."


def _number(value: float) -> str:
    """A bound as Python source: integers as written in the table (``10_000``)."""
    if float(value).is_integer():
        return f"{int(value):_}"
    return repr(float(value))


def _bounds(field: GpuField) -> str:
    """``ge=…, le=…`` for the bounds the field has."""
    parts = [f"{k}={_number(v)}" for k, v in (("ge", field.ge), ("le", field.le)) if v is not None]
    return ", ".join(parts)


def _module(
    doc: str,
    imports: Sequence[str],
    cls: Sequence[str],
    line: Callable[[GpuField], str],
) -> str:
    """A generated module: header, docstring, imports, one class whose body is a line a field."""
    out = [HEADER, f'"""{doc}"""', "", "from __future__ import annotations", ""]
    out += [*imports, "", "", *cls, f'    """{_CLASS_DOC}"""', ""]
    out += [f"    {line(f)}" for f in REPORTED]
    return "\n".join(out) + "\n"


def _annotated(field: GpuField, meta: str) -> str:
    """``Annotated[float, meta(ge=…, le=…)]``, or the bare type when it has no bound."""
    bounds = _bounds(field)
    return f"Annotated[{field.type}, {meta}({bounds})]" if bounds else field.type


def render() -> dict[Path, str]:
    """Each generated module's path (from the repository root) and text."""
    contract = _module(
        "The reported readings of the telemetry contract, from ``fields.GPU_FIELDS``.\n\n"
        "``schema.GpuReport`` inherits them. Imports pydantic only: the agent imports it.\n",
        ["from typing import Annotated", "", "from pydantic import BaseModel, Field"],
        ["class GpuReadings(BaseModel):"],
        lambda f: f"{f.name}: {_annotated(f, 'Field')} | None = None",
    )
    hot = _module(
        "The reported readings as the hot path decodes them, from ``fields.GPU_FIELDS``.\n\n"
        "``report.GpuReport`` inherits them; the bounds are the contract's. The agent never\n"
        "imports this module (it would load msgspec).\n",
        ["from typing import Annotated", "", "import msgspec"],
        ["class GpuReadings(msgspec.Struct, frozen=True, gc=False, kw_only=True):"],
        lambda f: f"{f.name}: {_annotated(f, 'msgspec.Meta')} | None = None",
    )
    agent = _module(
        "The readings a backend takes of a GPU, from the extender's ``fields.GPU_FIELDS``.\n\n"
        "``model.GpuReading`` inherits them. Imports only the standard library.\n",
        ["from dataclasses import dataclass"],
        ["@dataclass(frozen=True, slots=True, kw_only=True)", "class GpuReadings:"],
        lambda f: f"{f.name}: {f.type} | None = None",
    )
    return {
        Path("scheduler_extender/telemetry/readings.py"): contract,
        Path("scheduler_extender/telemetry/readings_msgspec.py"): hot,
        Path("node_agent/readings.py"): agent,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write the generated modules, or with ``--check`` list those that differ."""
    parser = argparse.ArgumentParser(prog="python -m tools.gen_fields", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on a change")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        target = ROOT / path
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print("out of date (run make generate):", *map(str, stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
