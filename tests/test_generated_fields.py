"""The reading fields generated from the field table (``make generate``), and what reads the table.

``scheduler_extender/telemetry/fields.py`` declares each per-GPU reading once; the pydantic,
msgspec and dataclass definitions of a GPU inherit modules written from it by
``tools/gen_fields.py``, as the device plugin's stubs are written from its ``.proto``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields as dataclass_fields
from pathlib import Path

import msgspec
import pytest

from node_agent.model import GpuReading, Snapshot
from node_agent.telemetry.report import Reporter
from scheduler_extender.telemetry import report as hot, schema
from scheduler_extender.telemetry.fields import GPU_FIELDS, REPORTED, GpuField
from tools import gen_fields

ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_modules_are_those_of_the_field_table() -> None:
    """``make generate`` was run after the last change to fields.py."""
    rendered = gen_fields.render()
    assert rendered, "nothing generated"
    for path, text in rendered.items():
        assert (ROOT / path).read_text(encoding="utf-8") == text, f"{path}: run make generate"


def test_a_generated_module_says_so_on_its_first_line() -> None:
    for text in gen_fields.render().values():
        first = text.splitlines()[0]
        assert "Generated from scheduler_extender/telemetry/fields.py" in first
        assert "do not edit" in first


def test_the_check_mode_finds_the_committed_modules_current() -> None:
    assert gen_fields.main(["--check"]) == 0


def test_every_definition_of_a_gpu_carries_each_reported_field_as_optional() -> None:
    names = [f.name for f in REPORTED]
    agent = {f.name: f for f in dataclass_fields(GpuReading)}
    wire = {f.name: f for f in msgspec.structs.fields(hot.GpuReport)}
    for name in names:
        assert agent[name].default is None and agent[name].kw_only, name
        assert wire[name].default is None, name
        assert schema.GpuReport.model_fields[name].default is None, name
    derived = {f.name for f in GPU_FIELDS if not f.reported}
    assert derived.isdisjoint(agent) and derived.isdisjoint(wire)
    assert derived.isdisjoint(schema.GpuReport.model_fields)


def test_a_derived_field_cannot_be_given_bounds_or_a_place_to_show() -> None:
    with pytest.raises(ValueError, match="derived"):
        GpuField("x", "help", le=1, derive=lambda gpu: None)
    with pytest.raises(ValueError, match="derived"):
        GpuField("x", "help", debug="summary", derive=lambda gpu: None)


def _inside(field: GpuField) -> float:
    """A value the contract takes: its upper bound, or just above its lower one."""
    if field.le is not None:
        return field.le
    return (field.ge or 0) + 1


def test_every_reported_reading_reaches_the_pushed_report_under_its_name() -> None:
    values = {f.name: _inside(f) for f in REPORTED}
    reading = GpuReading(index=0, uuid="GPU-0", **values)
    reporter = Reporter(node="n1", backend="simulated", interval_s=1.0, labels={},
                        wall=lambda: 1e9, host_boot_id=None)  # fmt: skip
    pushed = reporter.build(
        Snapshot(taken_at=1.0, readings=[reading]),
        {},
        xid_last={},
        self_test=None,
        holders=None,
    )
    (gpu,) = pushed.gpus
    assert {name: getattr(gpu, name) for name in values} == values


def test_the_agent_loads_neither_msgspec_nor_the_hot_path_readings() -> None:
    """The contract's generated readings are pydantic only: the agent runs without msgspec."""
    code = (
        "import sys, node_agent.cli, node_agent.loop\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'msgspec'"
        " or m == 'scheduler_extender.telemetry.readings_msgspec'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"
