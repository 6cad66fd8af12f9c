"""The hot-path decoder and the contract's pydantic model: the same fields, defaults and verdicts."""

import copy
import gc

import msgspec
import orjson
import pytest
from hypothesis import given
from pydantic import ValidationError

from scheduler_extender.policy.rules.thermal import ThermalArgs
from scheduler_extender.state.hysteresis import advance
from scheduler_extender.telemetry import decode, schema
from scheduler_extender.telemetry.fields import REPORTED
from scheduler_extender.telemetry.store import Received, TelemetryStore
from tests.builders import gpu, report
from tests.strategies import holder_names


def _struct_fields(struct):
    return {f.encode_name: f for f in msgspec.structs.fields(struct)}


@pytest.mark.parametrize(
    ("model", "struct"),
    [
        (schema.TelemetryReport, decode.TelemetryReport),
        (schema.AgentInfo, decode.AgentInfo),
        (schema.NodeHealth, decode.NodeHealth),
        (schema.GpuReport, decode.GpuReport),
        (schema.GpuProcess, decode.GpuProcess),
        (schema.PodHolder, decode.PodHolder),
        (schema.StepResult, decode.StepResult),
    ],
)
def test_both_definitions_have_the_same_fields_and_defaults(model, struct):
    fields = _struct_fields(struct)
    names = {info.alias or name for name, info in model.model_fields.items()}
    assert set(fields) == names
    for name, info in model.model_fields.items():
        field = fields[info.alias or name]
        if info.is_required():
            assert field.required, name
        else:
            default = info.get_default(call_default_factory=True)
            mine = (
                field.default_factory()
                if field.default_factory is not msgspec.NODEFAULT
                else field.default
            )
            if isinstance(mine, tuple):  # the hot-path structs keep sequences as tuples
                mine = list(mine)
            if isinstance(default, schema.NodeHealth):
                default = msgspec.structs.asdict(decode.NodeHealth(**default.model_dump()))
                mine = msgspec.structs.asdict(mine)
            assert mine == default, name


def _number_schema(prop):
    """The number branch of a ``<number> | None`` property of a JSON schema, its bounds only."""
    (branch,) = [b for b in prop["anyOf"] if b.get("type") != "null"]
    return {k: branch[k] for k in ("type", "minimum", "maximum") if k in branch}


def test_both_definitions_bound_every_reading_as_the_field_table_says():
    """The pydantic and msgspec reading fields are generated from one table: the same bounds."""
    contract = schema.GpuReport.model_json_schema()["properties"]
    hot = msgspec.json.schema_components([decode.GpuReport])[1]["GpuReport"]
    for field in REPORTED:
        want = {"type": {"float": "number", "int": "integer"}[field.type]}
        want |= {k: v for k, v in (("minimum", field.ge), ("maximum", field.le)) if v is not None}
        assert _number_schema(contract[field.name]) == want, field.name
        assert _number_schema(hot["properties"][field.name]) == want, field.name
        assert contract[field.name]["default"] is None
        assert hot["properties"][field.name]["default"] is None


@pytest.mark.parametrize("field", REPORTED, ids=lambda f: f.name)
def test_both_definitions_refuse_a_reading_just_outside_its_bounds(field):
    for bound, step in ((field.ge, -1), (field.le, 1)):
        if bound is None:
            continue
        doc = report("n1", [gpu(0, **{field.name: bound}), gpu(1, **{field.name: bound + step})])
        body = orjson.dumps(doc)
        with pytest.raises(ValidationError):
            schema.TelemetryReport.model_validate_json(body)
        with pytest.raises(decode.ReportError) as err:
            decode.decode_report(body)
        assert [p["loc"] for p in err.value.problems] == [f"gpus.1.{field.name}"]


def _variants():
    """Valid reports and reports broken at every limit the schema sets."""
    base = report("n1", [gpu(0, processes=[{"pid": 1, "pod_uid": "u", "used_mib": 10.0}]), gpu(1)])
    base["holders"] = [
        {"namespace": "default", "name": "web-0", "gpu_uuid": "GPU-0000", "blocks": 2},
        {"namespace": "default", "name": "web-0", "gpu_uuid": "GPU-0001", "blocks": 1},
    ]
    yield "valid", base, True
    yield "valid, holders not known", {**base, "holders": None}, True
    yield "valid, no holders", {k: v for k, v in base.items() if k != "holders"}, True
    yield "valid, unknown fields ignored", {**base, "future": {"x": 1}}, True
    yield "valid, nulls", {**base, "gpus": [gpu(0, temperature_c=None, power_w=None)]}, True
    yield (
        "valid, a model and a label in unicode",
        {**base, "gpus": [gpu(0, model="Radeon™ RX 7900 XTX"), gpu(1, model="昇腾 910B")],
         "labels": {"edgegpu.io/site": "münchen-süd"}},
        True,
    )  # fmt: skip
    yield (
        "valid, a self-test's detail over several lines",
        {**base, "self_test": {"id": "t1", "verdict": "fail", "detail": "dmesg:\nxid 79"}},
        True,
    )
    yield (
        "valid, no labels or health",
        {k: v for k, v in base.items() if k not in ("labels", "node_health")},
        True,
    )

    def broken(path, value):
        doc = copy.deepcopy(base)
        target = doc
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc

    for name, path, value in [
        ("wrong schema", ("schema",), "edgegpu.io/telemetry/v2"),
        ("no node", ("node",), KeyError),
        ("empty node", ("node",), ""),
        ("node too long", ("node",), "n" * 254),
        ("negative seq", ("agent", "seq"), -1),
        ("empty boot id", ("agent", "boot_id"), ""),
        ("zero interval", ("interval_s",), 0),
        ("interval over an hour", ("interval_s",), 3601),
        ("bad time", ("sampled_at",), "yesterday"),
        ("ratio over 1", ("node_health", "cuda_ctx_success_ratio"), 1.5),
        ("gpu index 64", ("gpus", 1, "index"), 64),
        ("duplicate gpu index", ("gpus", 1, "index"), 0),
        ("hot beyond reason", ("gpus", 0, "temperature_c"), 201),
        ("negative power", ("gpus", 0, "power_w"), -1),
        ("utilisation over 100", ("gpus", 0, "utilization_pct"), 100.5),
        ("unknown health", ("gpus", 0, "health"), "sick"),
        ("bad reason code", ("gpus", 0, "health_reasons"), ["Has Spaces"]),
        ("empty uuid", ("gpus", 0, "uuid"), ""),
        ("model with a terminal escape", ("gpus", 0, "model"), "Tesla T4\x1b]0;owned\x07"),
        ("model with a C1 CSI", ("gpus", 1, "model"), "T4\x9b2J"),
        ("model with a bidi override", ("gpus", 0, "model"), "T4\u202e"),
        ("vendor with a newline", ("gpus", 0, "vendor"), "nvidia\n"),
        ("uuid with DEL", ("gpus", 0, "uuid"), "GPU-\x7f"),
        (
            "process container with a carriage return",
            ("gpus", 0, "processes", 0, "container"),
            "app\r",
        ),
        ("node with a newline", ("node",), "n1\nn2"),
        ("boot id with a control character", ("agent", "boot_id"), "b\x00"),
        ("agent version with an escape", ("agent", "version"), "0.1\x1b[31m"),
        ("backend with a C1 character", ("agent", "backend"), "nvml\x85"),
        ("host boot id with a tab", ("host_boot_id",), "h\t1"),
        ("self-test id with a bidi isolate", ("self_test",), {"id": "t\u2066", "verdict": "pass"}),
        ("process pod uid with a newline", ("gpus", 0, "processes", 0, "pod_uid"), "u\n"),
        ("label key with a control character", ("labels",), {"edgegpu.io/\x1brack": "a"}),
        ("label value with a line separator", ("labels",), {"edgegpu.io/rack": "a\u2028b"}),
        ("negative pid", ("gpus", 0, "processes", 0, "pid"), -3),
        ("label value too long", ("labels",), {"k": "v" * 64}),
        ("gpus not a list", ("gpus",), {"0": {}}),
        ("temperature as text", ("gpus", 0, "temperature_c"), "hot"),
        ("holder namespace in capitals", ("holders", 0, "namespace"), "Default"),
        ("holder namespace too long", ("holders", 0, "namespace"), "n" * 64),
        ("holder pod name too long", ("holders", 0, "name"), "p" * 254),
        ("holder pod name with a newline", ("holders", 0, "name"), "web-0\n"),
        ("holder gpu uuid with a control character", ("holders", 0, "gpu_uuid"), "GPU-\x1b0"),
        ("holder gpu uuid empty", ("holders", 0, "gpu_uuid"), ""),
        ("holder with no blocks", ("holders", 0, "blocks"), 0),
        ("holder with no pod name", ("holders", 0, "name"), KeyError),
        ("the same holder twice", ("holders", 1, "gpu_uuid"), "GPU-0000"),
    ]:
        yield name, broken(path, value), False
    yield "65 gpus", {**base, "gpus": [gpu(i % 64) for i in range(65)]}, False
    many = [
        {"namespace": "default", "name": f"p{i}", "gpu_uuid": "GPU-0000", "blocks": 1}
        for i in range(1025)
    ]
    yield "1,025 holders", {**base, "holders": many}, False


@pytest.mark.parametrize(
    ("name", "doc", "valid"), list(_variants()), ids=[v[0] for v in _variants()]
)
def test_both_definitions_take_and_refuse_the_same_reports(name, doc, valid):
    body = orjson.dumps(doc)
    try:
        model = schema.TelemetryReport.model_validate_json(body)
        pydantic_ok = True
    except ValidationError:
        pydantic_ok = False
    assert pydantic_ok is valid
    if valid:
        fast = decode.decode_report(body)
        assert orjson.loads(msgspec.json.encode(fast)) == orjson.loads(
            model.model_dump_json(by_alias=True)
        )
    else:
        with pytest.raises(decode.ReportError) as err:
            decode.decode_report(body)
        assert err.value.problems and all(p["msg"] for p in err.value.problems)


def test_a_refused_report_lists_every_problem_with_its_place():
    doc = report("n1", [gpu(0, temperature_c=500.0), gpu(1, utilization_pct=-1.0)])
    doc["agent"]["seq"] = -1
    with pytest.raises(decode.ReportError) as err:
        decode.decode_report(orjson.dumps(doc))
    places = {p["loc"] for p in err.value.problems}
    assert places == {"agent.seq", "gpus.0.temperature_c", "gpus.1.utilization_pct"}
    assert str(err.value) == "invalid telemetry report (3 problems)"


def test_a_refused_holder_is_named_by_its_place_and_field():
    doc = report("n1", [gpu(0)])
    doc["holders"] = [
        {"namespace": "default", "name": "ok", "gpu_uuid": "GPU-0000", "blocks": 1},
        {"namespace": "kube_system", "name": "web-0", "gpu_uuid": "GPU-0000", "blocks": 0},
    ]
    with pytest.raises(decode.ReportError) as err:
        decode.decode_report(orjson.dumps(doc))
    assert {p["loc"] for p in err.value.problems} == {"holders.1.namespace", "holders.1.blocks"}


@given(namespace=holder_names(), name=holder_names(), uuid=holder_names())
def test_both_definitions_judge_a_holders_names_alike(namespace, name, uuid):
    doc = report("n1", [gpu(0)])
    doc["holders"] = [{"namespace": namespace, "name": name, "gpu_uuid": uuid, "blocks": 1}]
    body = orjson.dumps(doc)
    try:
        schema.TelemetryReport.model_validate_json(body)
        valid = True
    except ValidationError:
        valid = False
    try:
        decode.decode_report(body)
        fast = True
    except decode.ReportError:
        fast = False
    assert fast is valid


def test_not_json_is_one_located_problem():
    with pytest.raises(decode.ReportError) as err:
        decode.decode_report(b"{nope")
    assert len(err.value.problems) == 1 and "JSON" in err.value.problems[0]["msg"]


def test_what_the_agent_sends_decodes_to_the_same_values():
    doc = report(
        "n1",
        [gpu(0), gpu(3, temperature_c=88.5, health="degraded", health_reasons=["temp:over-max"])],
    )
    sent = schema.TelemetryReport.model_validate(doc).to_json_bytes()
    got = decode.decode_report(sent)
    assert got.gpus[1].index == 3 and got.gpus[1].temperature_c == 88.5
    assert got.gpus[1].health_reasons == ("temp:over-max",) and got.node == "n1"


def test_a_stored_report_is_not_walked_by_the_garbage_collector():
    """5,000 nodes' reports kept young objects alive and made collections stop the loop."""
    doc = report(
        "n1",
        [
            gpu(0, processes=[{"pid": 1, "pod_uid": "u", "used_mib": 10.0}]),
            gpu(1, temperature_c=99.0, health="degraded", health_reasons=["temp:over-max"]),
        ],
    )
    doc["gpus"][0]["throttle_reasons"] = ["sw_power_cap"]
    store = TelemetryStore()
    args = ThermalArgs.model_validate({"maxTemp": 85})
    push = Received.of(decode.decode_report(orjson.dumps(doc)))
    assert store.put(push, 1.0, 1.0, advance(None, push, 1.0, args)).accepted
    gc.collect()  # a tuple of untracked items leaves the collector's lists at its first pass
    record = store.get("n1")
    assert record is not None
    rep = record.report
    kept = [record, rep, rep.agent, rep.node_health, rep.labels, rep.gpus]
    for g in rep.gpus:
        kept += [g, g.throttle_reasons, g.health_reasons, g.processes, *g.processes]
    assert [type(o).__name__ for o in kept if gc.is_tracked(o)] == []
    assert record.thermal  # the hot GPU's cool-down state is kept
