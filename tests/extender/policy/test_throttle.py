"""The throttle rule: a GPU slowed for heat or power ranks below its twin at full clocks."""

import numpy as np
import pytest

from scheduler_extender.domain import PodDemand, QosClass
from scheduler_extender.policy.combine import Context, evaluate
from scheduler_extender.policy.document import DEFAULT_POLICY
from scheduler_extender.policy.rules import TERMS
from scheduler_extender.telemetry.decode import report_from
from scheduler_extender.telemetry.fields import GPU_FIELDS
from scheduler_extender.telemetry.report import digest
from tests.builders import batch, gpu, report

SLOWDOWN = next(f for f in GPU_FIELDS if f.name == "slowdown")


def demand(qos: QosClass = QosClass.TRAINING) -> PodDemand:
    return PodDemand(uid="u", namespace="d", name="p", qos=qos, mem_blocks=1)


@pytest.mark.parametrize(
    ("reasons", "slowed"),
    [
        ([], 0.0),
        (["gpu_idle", "applications_clocks_setting"], 0.0),
        (["sw_power_cap"], 0.0),  # at its power limit under full load: not slowed
        (["sw_thermal_slowdown"], 1.0),
        (["gpu_idle", "hw_power_brake_slowdown"], 1.0),
    ],
)
def test_the_reported_throttle_reasons_give_the_slowdown_field(reasons, slowed):
    doc = report("n1", [gpu(0, throttle_reasons=reasons)])
    assert digest(report_from(doc)).column("slowdown") == [slowed]
    assert SLOWDOWN.metric == "node_gpu_clock_slowdown"


def test_gpus_of_vendors_whose_tools_report_no_reasons_are_unknown_not_unslowed():
    doc = report("n1", [gpu(0, vendor="amd"), gpu(1, vendor="nvidia", throttle_reasons=[])])
    unknown, full = digest(report_from(doc)).column("slowdown")
    assert np.isnan(unknown) and full == 0.0


def test_a_slowed_node_scores_below_its_twin_and_best_effort_does_not_mind():
    twins = batch(n=2, readings={"slowdown": [1.0, 0.0]})
    for qos in (QosClass.REALTIME, QosClass.TRAINING, QosClass.INFERENCE):
        ev = evaluate(twins, demand(qos), DEFAULT_POLICY, Context(now=1000.0))
        assert ev.passed.all() and ev.score[0] < ev.score[1], qos
        assert list(ev.terms[:, TERMS.index("throttle")]) == [0.0, 1.0]
    ev = evaluate(twins, demand(QosClass.BEST_EFFORT), DEFAULT_POLICY, Context(now=1000.0))
    assert ev.score[0] == ev.score[1]


def test_on_one_node_the_gpu_at_full_clocks_is_chosen_and_unknown_is_not_slowed():
    node = batch(g=2, readings={"slowdown": [1.0, 0.0]})
    ev = evaluate(node, demand(), DEFAULT_POLICY, Context(now=1000.0))
    assert ev.gpus[0].tolist() == [1]
    unknown = batch(n=2, readings={"slowdown": [np.nan, 0.0]})
    ev = evaluate(unknown, demand(), DEFAULT_POLICY, Context(now=1000.0))
    assert ev.score[0] == ev.score[1]
