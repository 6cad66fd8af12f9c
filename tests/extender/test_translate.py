import pytest

from scheduler_extender.domain import QosClass
from scheduler_extender.errors import RequestError
from scheduler_extender.k8s.translate import pod_demand
from scheduler_extender.policy.qos import QosArgs
from tests.builders import pod

QOS = QosArgs()


def test_blocks_and_class_are_read_from_the_pod():
    d = pod_demand(pod("p", blocks=2, qos="training", group="job-7"), QOS)
    assert (d.mem_blocks, d.whole_gpus, d.qos, d.group, d.uid) == (
        2,
        0,
        QosClass.TRAINING,
        "job-7",
        "uid-p",
    )


def test_requests_count_when_limits_are_absent_and_init_containers_take_the_max():
    p = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"edgegpu.io/gpu-mem-block": "1"}}},
                {"name": "b", "resources": {"limits": {"edgegpu.io/gpu-mem-block": 2}}},
            ],
            "initContainers": [
                {"name": "i", "resources": {"limits": {"edgegpu.io/gpu-mem-block": "5"}}}
            ],
        },
    }
    assert pod_demand(p, QOS).mem_blocks == 5


def test_gang_labels_of_other_schedulers_name_the_group():
    p = pod("p")
    p["metadata"]["labels"] = {"volcano.sh/job-name": "vj"}
    assert pod_demand(p, QOS).group == "vj"


def test_a_pod_without_uid_or_namespace_still_gets_an_identity():
    d = pod_demand({"metadata": {"name": "x"}, "spec": {"containers": None}}, QOS)
    assert (d.uid, d.namespace, d.wants_gpu) == ("default/x", "default", False)


@pytest.mark.parametrize(
    ("spec_change", "message"),
    [
        pytest.param({"blocks": "0.5"}, "is not a whole number", id="fractional blocks"),
        pytest.param({"blocks": "-1"}, "is not a whole number", id="negative blocks"),
        pytest.param({"blocks": 1, "whole": 1}, "use one", id="both kinds of gpu request"),
        pytest.param({"qos": "gold"}, "is not a QoS class", id="unknown qos class"),
    ],
)
def test_bad_pod_specs_say_which_field_is_wrong(spec_change, message):
    with pytest.raises(RequestError, match=message):
        pod_demand(pod("p", **spec_change), QOS)


def test_a_non_integer_priority_is_refused():
    p = pod("p")
    p["spec"]["priority"] = "high"
    with pytest.raises(RequestError, match=r"spec\.priority"):
        pod_demand(p, QOS)
