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
        pytest.param({"blocks": "0.5"}, "is not a count", id="fractional blocks"),
        pytest.param({"blocks": "-1"}, "is not a count", id="negative blocks"),
        pytest.param({"blocks": 1, "whole": 1}, "use one", id="both kinds of gpu request"),
        pytest.param({"qos": "gold"}, "is not a QoS class", id="unknown qos class"),
        pytest.param({"blocks": 2**63}, "more than any node has", id="2^63 blocks"),
        pytest.param({"blocks": "1" + "0" * 20}, "more than any node has", id="10^20 blocks"),
        pytest.param({"blocks": None, "whole": 2**64}, "more than any node has", id="2^64 gpus"),
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


def test_host_requests_read_cpu_and_memory_like_the_scheduler():
    from scheduler_extender.k8s.translate import host_requests

    p = {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}},
                # only limits: the request defaults to them
                {"name": "b", "resources": {"limits": {"cpu": 2, "memory": "512Mi"}}},
                {"name": "c"},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "4"}}}],
        },
    }
    # CPU: max(1.5 + 2, 4) = 4 cores; memory: 1 GiB + 512 MiB, rounded up to MiB.
    assert host_requests(p, "pod p") == (4000, 1536)
    d = pod_demand(pod("q", requests={"cpu": "250m", "memory": "1000000"}), QOS)
    assert (d.cpu_milli, d.host_memory_mib) == (250, 1)  # 1e6 bytes is just under 1 MiB


@pytest.mark.parametrize("bad", ["lots", "-1", True, {"x": 1}])
def test_a_bad_cpu_request_is_a_clear_error(bad):
    with pytest.raises(RequestError, match="cpu"):
        pod_demand(pod("q", requests={"cpu": bad}), QOS)


def test_node_allocatable_is_nan_where_missing_or_unreadable():
    from scheduler_extender.k8s.translate import node_allocatable

    cpu, mem = node_allocatable({"status": {"allocatable": {"cpu": "7900m", "memory": "x"}}})
    assert cpu == 7900 and mem != mem
    cpu, mem = node_allocatable({"status": {"allocatable": {"memory": "2Gi"}}})
    assert cpu != cpu and mem == 2048
    assert all(v != v for v in node_allocatable({}))
