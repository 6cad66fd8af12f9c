"""The cooling rule: a GPU whose fan runs near full speed ranks below a twin with room."""

import numpy as np

from scheduler_extender.domain import PodDemand, QosClass
from scheduler_extender.policy.combine import Context, evaluate
from scheduler_extender.policy.document import DEFAULT_POLICY
from scheduler_extender.policy.rules import TERMS
from scheduler_extender.telemetry.decode import report_from
from scheduler_extender.telemetry.report import digest
from tests.builders import batch, gpu, report

COOLING = TERMS.index("cooling")


def demand(qos: QosClass = QosClass.TRAINING) -> PodDemand:
    return PodDemand(uid="u", namespace="d", name="p", qos=qos, mem_blocks=1)


def test_the_reported_fan_speed_reaches_the_rules_and_a_passive_board_reports_none():
    doc = report("n1", [gpu(0, fan_speed_pct=92.0), gpu(1)])
    fan, passive = digest(report_from(doc)).column("fan_speed_pct")
    assert fan == 92.0 and np.isnan(passive)


def test_a_gpu_whose_fan_is_near_full_speed_scores_below_its_twin_and_best_effort_does_not_mind():
    twins = batch(n=2, readings={"fan_speed_pct": [95.0, 40.0]})
    for qos in (QosClass.REALTIME, QosClass.TRAINING, QosClass.INFERENCE):
        ev = evaluate(twins, demand(qos), DEFAULT_POLICY, Context(now=1000.0))
        assert ev.passed.all() and ev.score[0] < ev.score[1], qos
        assert list(ev.terms[:, COOLING]) == [0.1, 1.0]
    ev = evaluate(twins, demand(QosClass.BEST_EFFORT), DEFAULT_POLICY, Context(now=1000.0))
    assert ev.score[0] == ev.score[1]


def test_on_one_node_the_gpu_with_fan_room_is_chosen_and_a_passive_board_is_not_judged():
    node = batch(g=2, readings={"fan_speed_pct": [100.0, 60.0]})
    assert evaluate(node, demand(), DEFAULT_POLICY, Context(now=1000.0)).gpus[0].tolist() == [1]
    passive = batch(n=2, readings={"fan_speed_pct": [np.nan, 50.0]})
    ev = evaluate(passive, demand(), DEFAULT_POLICY, Context(now=1000.0))
    assert ev.score[0] == ev.score[1]
