"""The upstream extender/v1 vectors (tests/fixtures/extender-v1, copied from kube-scheduler)."""

from pathlib import Path

import orjson
import pytest

from scheduler_extender.errors import RequestError
from scheduler_extender.k8s import wire

FIXTURES = Path(__file__).parent.parent / "fixtures" / "extender-v1"
FOLDERS = [FIXTURES, FIXTURES / "pre-v1.34"]


def vectors(name):
    for folder in FOLDERS:
        text = (folder / name).read_bytes()
        yield pytest.param(text, id=f"{folder.name}")
        yield pytest.param(text.lower(), id=f"{folder.name}-lowercased")


@pytest.mark.parametrize("body", list(vectors("ExtenderArgs.json")))
def test_extender_args_vectors_parse_with_both_forms(body):
    args = wire.parse_extender_args(body)
    assert args.node_names == ["node1"]
    assert args.nodes_names == ["nodename"]
    assert args.candidates() == ["node1", "nodename"]
    assert args.pod["metadata"]["name"] == "podname"


@pytest.mark.parametrize("body", list(vectors("ExtenderPreemptionArgs.json")))
def test_preemption_args_vectors_parse(body):
    args = wire.parse_preemption_args(body)
    assert list(args.victims) == ["foo"]
    assert args.victims["foo"].uids == ["myuid"]
    assert args.victims["foo"].num_pdb_violations == 1


@pytest.mark.parametrize("body", list(vectors("ExtenderBindingArgs.json")))
def test_binding_args_vectors_parse(body):
    args = wire.parse_binding_args(body)
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == (
        "mypodname",
        "mypodnamespace",
        "mypoduid",
        "mynode",
    )


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_our_answers_use_the_go_field_names_of_the_vectors(folder):
    def keys(name):
        return set(orjson.loads((folder / name).read_bytes()))

    args = wire.parse_extender_args((folder / "ExtenderArgs.json").read_bytes())
    filt = orjson.loads(
        wire.encode_filter_result(
            args, {"node1", "nodename"}, {"foo": "bar"}, {"baz": "qux"}, "myerror"
        )
    )
    assert set(filt) == keys("ExtenderFilterResult.json")
    expected = orjson.loads((folder / "ExtenderFilterResult.json").read_bytes())
    assert filt == expected
    host = orjson.loads(wire.encode_priorities(["myhost"], [1]))
    assert host == [orjson.loads((folder / "HostPriority.json").read_bytes())]
    pre = wire.parse_preemption_args((folder / "ExtenderPreemptionArgs.json").read_bytes())
    assert orjson.loads(wire.encode_preemption_result(pre.victims)) == orjson.loads(
        (folder / "ExtenderPreemptionResult.json").read_bytes()
    )
    assert orjson.loads(wire.encode_binding_result("myerror")) == orjson.loads(
        (folder / "ExtenderBindingResult.json").read_bytes()
    )


def test_full_victims_are_turned_into_uids():
    body = orjson.dumps(
        {
            "Pod": {"metadata": {"name": "hi"}},
            "NodeNameToVictims": {
                "n1": {
                    "Pods": [{"metadata": {"uid": "a"}, "spec": {"priority": 5}}],
                    "NumPDBViolations": 0,
                }
            },
            "NodeNameToMetaVictims": None,
        }
    )
    args = wire.parse_preemption_args(body)
    assert args.victims["n1"].uids == ["a"]
    assert args.victims["n1"].priorities == [5]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"{not json", "not valid JSON", id="broken json"),
        pytest.param(b"[1, 2]", "must be a JSON object", id="an array instead of an object"),
        pytest.param(
            b'{"Pod": "x", "NodeNames": []}', "Pod must be an object", id="pod of the wrong type"
        ),
        pytest.param(
            b'{"Pod": {}, "NodeNames": "n1"}',
            "NodeNames must be a list of strings",
            id="names not a list",
        ),
        pytest.param(
            b'{"Pod": {}, "NodeNames": [1]}',
            "NodeNames must be a list of strings",
            id="names not strings",
        ),
        pytest.param(
            b'{"Pod": {}, "Nodes": {"items": [{}]}}',
            "Nodes.items[0].metadata.name",
            id="node without a name",
        ),
        pytest.param(
            b'{"Pod": {}, "Nodes": []}',
            "Nodes must be a NodeList object",
            id="nodes not a list object",
        ),
        pytest.param(b'{"Pod": {}}', "neither NodeNames nor Nodes", id="no candidates at all"),
    ],
)
def test_malformed_requests_name_what_is_wrong(body, message):
    with pytest.raises(RequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        wire.parse_extender_args(body)


def test_a_key_given_twice_in_two_spellings_is_refused_not_guessed():
    body = b'{"Pod":{"metadata":{"name":"p"}},"nodenames":["cool-1"],"NodeNames":["hot-1"]}'
    with pytest.raises(RequestError, match="given twice"):
        wire.parse_extender_args(body, "filter")
    # The list it would have cached stays unknown: a genuine request for it parses as sent.
    genuine = b'{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["hot-1"]}'
    assert wire.parse_extender_args(genuine, "filter").candidates() == ["hot-1"]
