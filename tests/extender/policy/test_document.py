import ast
import inspect

import pytest

from scheduler_extender.config import load_policy_text
from scheduler_extender.domain import QosClass
from scheduler_extender.errors import PolicyError
from scheduler_extender.policy import document
from scheduler_extender.policy.document import DEFAULT_POLICY, SECTIONS, PolicySpec, parse_policy
from scheduler_extender.policy.rules import TERMS, thermal

SEED_JSON = """{"apiVersion": "kepler.io/v1", "kind": "GPUSchedulingPolicy",
 "metadata": {"name": "edge-gpu-policy"},
 "spec": {"powerSaving": {"enabled": true, "threshold": 70},
          "thermalThrottling": {"maxTemp": 85, "coolDownPeriod": "5m"}}}"""

SEED_YAML = """
apiVersion: kepler.io/v1
kind: GPUSchedulingPolicy
metadata:
  name: edge-gpu-policy
spec:
  powerSaving:
    enabled: true
    threshold: 70
  thermalThrottling:
    maxTemp: 85
    coolDownPeriod: 5m
"""


@pytest.mark.parametrize("text", [SEED_JSON, SEED_YAML], ids=["json", "yaml"])
def test_the_seed_document_is_accepted_verbatim(text):
    policy = load_policy_text(text, "seed")
    assert policy.metadata.name == "edge-gpu-policy"
    assert policy.spec.thermal_throttling.max_temp_c == 85
    assert policy.spec.thermal_throttling.cool_down_s == 300
    assert policy.spec.power_saving.enabled is True
    assert policy.spec.power_saving.threshold_pct == 70


def test_no_document_gives_the_documented_defaults():
    spec = DEFAULT_POLICY.spec
    assert spec.thermal_throttling.max_temp_c == 85
    assert spec.thermal_throttling.cool_down_s == 300
    assert spec.thermal_throttling.migrate_after_s == 120
    assert spec.memory.block_mib == 4096
    assert spec.stale_telemetry.fail_open[QosClass.TRAINING] is False
    assert spec.stale_telemetry.fail_open[QosClass.INFERENCE] is True


def test_every_error_is_listed_at_once():
    with pytest.raises(PolicyError) as info:
        parse_policy(
            {
                "apiVersion": "v2",
                "kind": "GPUSchedulingPolicy",
                "spec": {
                    "thermalThrottling": {"maxTemp": "hot", "coolDownPeriod": "5 min"},
                    "powerSaving": {"threshold": 140},
                    "maxtemp": 80,
                },
            }
        )
    errors = info.value.errors
    assert len(errors) == 5
    joined = "\n".join(errors)
    for key in ("apiVersion", "maxTemp", "coolDownPeriod", "threshold", "maxtemp"):
        assert key in joined


def test_our_extensions_are_optional_and_validated():
    policy = parse_policy(
        {
            "spec": {
                "qos": {"weights": {"training": {"thermal": 9}}, "defaultClass": "best-effort"},
                "staleTelemetry": {"after": "30s", "failOpen": {"training": True}},
                "memory": {"blockMiB": 1024},
                "topology": {"rackLabel": "example.com/rack"},
                "weights": {"thermal": 2},
            }
        }
    )
    assert policy.spec.qos.default_class is QosClass.BEST_EFFORT
    assert policy.class_weights(QosClass.TRAINING)[0] == 18
    # Terms the class leaves out keep the class's defaults (training's topology is 3), not 1.
    default = DEFAULT_POLICY.class_weights(QosClass.TRAINING)
    assert policy.class_weights(QosClass.TRAINING)[1:] == default[1:]
    assert default[TERMS.index("topology")] == 3
    assert policy.spec.stale_telemetry.stale_after_s(5.0) == 30.0
    assert policy.spec.stale_telemetry.fail_open[QosClass.TRAINING] is True
    assert policy.spec.stale_telemetry.fail_open[QosClass.REALTIME] is False


def test_a_weight_for_a_term_no_rule_registers_is_refused():
    with pytest.raises(PolicyError, match="fanSpeed"):
        parse_policy({"spec": {"qos": {"weights": {"training": {"fanSpeed": 1}}}}})
    with pytest.raises(PolicyError, match="fanSpeed"):
        parse_policy({"spec": {"weights": {"fanSpeed": 1}}})


def test_a_document_that_is_not_a_mapping_is_refused():
    with pytest.raises(PolicyError, match=r"not a GPUSchedulingPolicy.*parses as a list"):
        load_policy_text("- a\n- b\n", "list")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy_text("{unclosed", "broken")


def test_the_policy_is_shown_with_class_names_and_durations():
    shown = DEFAULT_POLICY.describe()
    assert shown["spec"]["thermalThrottling"]["coolDownPeriod"] == "5m"
    assert set(shown["spec"]["qos"]["weights"]) == {
        "realtime",
        "training",
        "inference",
        "best-effort",
    }
    assert shown["spec"]["staleTelemetry"]["failOpen"]["inference"] is True


def test_the_spec_has_one_field_per_registered_section_read_by_its_key():
    fields = PolicySpec.model_fields
    assert list(fields) == [s.name for s in SECTIONS] + ["whole_gpu_resources"]
    for section in SECTIONS:
        assert fields[section.name].annotation is section.args
        assert fields[section.name].alias == section.key
        assert fields[section.name].description == section.help
    assert DEFAULT_POLICY.spec[thermal.SECTION] is DEFAULT_POLICY.spec.thermal_throttling


def test_what_type_checkers_see_of_the_spec_names_every_section_with_its_args():
    tree = ast.parse(inspect.getsource(document))
    (stub,) = (
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name == "PolicySpec"
    )
    seen = {
        node.target.id: ast.unparse(node.annotation)
        for node in stub.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    expected = {s.name: s.args.__name__ for s in SECTIONS}
    assert seen == {**expected, "whole_gpu_resources": "tuple[str, ...]"}
