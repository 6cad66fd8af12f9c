"""The kube-scheduler extender v1 wire format (``k8s.io/kube-scheduler/extender/v1``).

Top-level keys are Go field names (PascalCase) and are matched without regard to case, as Go's
decoder does; embedded Pod and Node objects stay open dicts. Parsing is orjson into plain
structures: no per-node model objects. Imports orjson and ``errors`` only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

import orjson

from scheduler_extender.errors import RequestError

JsonDict = dict[str, Any]


def _top(body: bytes, what: str) -> JsonDict:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{what}: body is not valid JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(doc, dict):
        raise RequestError(f"{what}: body must be a JSON object, not {type(doc).__name__}")
    # Go matches field names case-insensitively. A key given twice in two spellings is
    # refused: which one counts would be a guess, and a guess that differs from the bytes
    # the candidate-list cache keeps would decide on a list the scheduler never sent.
    folded: JsonDict = {}
    for key, value in doc.items():
        lower = key.lower()
        if lower in folded:
            raise RequestError(f"{what}: key {key!r} is given twice (keys match in any case)")
        folded[lower] = value
    return folded


def _all_strings(value: Any) -> bool:
    """A list of strings only (checked at C speed: join refuses anything that is not a str)."""
    if not isinstance(value, list):
        return False
    try:
        "".join(value)
    except TypeError:
        return False
    return True


def _pod(doc: JsonDict, what: str) -> JsonDict:
    pod = doc.get("pod")
    if not isinstance(pod, dict):
        raise RequestError(f"{what}: Pod must be an object")
    return pod


def node_name_of(node: Any, where: str) -> str:
    """``metadata.name`` of a Node object, or a RequestError saying where it is missing."""
    meta = node.get("metadata") if isinstance(node, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.metadata.name must be a non-empty string")
    return name


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize request: the pod and the candidates, by name or in full."""

    pod: JsonDict
    node_names: list[str] | None
    """Set when the scheduler is ``nodeCacheCapable``."""
    nodes: list[JsonDict] | None
    """Full Node objects, set when it is not."""
    nodes_names: list[str] | None
    """``metadata.name`` of each of ``nodes``."""

    def candidates(self) -> list[str]:
        """Every node name to decide on, without duplicates, in request order."""
        if self.nodes_names is None:
            return self.node_names or []
        if self.node_names is None:
            return self.nodes_names
        return list(dict.fromkeys([*self.node_names, *self.nodes_names]))

    def labels(self) -> list[Mapping[str, str] | None] | None:
        """Labels of the full Node objects, aligned with ``candidates()`` (None in names mode)."""
        if self.nodes is None or self.nodes_names is None:
            return None
        by_name: dict[str, Mapping[str, str] | None] = {}
        for name, node in zip(self.nodes_names, self.nodes, strict=True):
            labels = node["metadata"].get("labels")
            by_name[name] = labels if isinstance(labels, dict) else None
        return [by_name.get(n) for n in self.candidates()]


def parse_extender_args(body: bytes, what: str = "filter") -> ExtenderArgs:
    """Parse ``ExtenderArgs``; raises RequestError with the bad key named."""
    doc = _top(body, what)
    pod = _pod(doc, what)
    names = doc.get("nodenames")
    if names is not None and not _all_strings(names):
        raise RequestError(f"{what}: NodeNames must be a list of strings")
    nodes_doc = doc.get("nodes")
    items: list[JsonDict] | None = None
    item_names: list[str] | None = None
    if nodes_doc is not None:
        if not isinstance(nodes_doc, dict):
            raise RequestError(f"{what}: Nodes must be a NodeList object")
        raw_items = nodes_doc.get("items")
        if raw_items is None:
            raw_items = []
        if not isinstance(raw_items, list):
            raise RequestError(f"{what}: Nodes.items must be a list")
        item_names = [
            node_name_of(node, f"{what}: Nodes.items[{i}]") for i, node in enumerate(raw_items)
        ]
        items = raw_items
    if names is None and items is None:
        raise RequestError(f"{what}: neither NodeNames nor Nodes is set")
    return ExtenderArgs(pod=pod, node_names=names, nodes=items, nodes_names=item_names)


def encode_filter_result(
    args: ExtenderArgs | None,
    passed: Sequence[bool] | None,
    failed: Mapping[str, str] | None = None,
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> bytes:
    """``ExtenderFilterResult`` in the form the request used (names, objects, or both).

    ``passed`` is aligned with ``args.candidates()``; request order is kept, and the node
    objects go back exactly as they came.
    """
    node_names: list[str] | None = None
    nodes: JsonDict | None = None
    if args is not None and passed is not None:
        both = args.node_names is not None and args.nodes is not None
        keep = set(compress(args.candidates(), passed)) if both else set()
        if args.node_names is not None:
            if both:
                node_names = [n for n in args.node_names if n in keep]
            else:
                node_names = list(compress(args.node_names, passed))
        if args.nodes is not None and args.nodes_names is not None:
            if both:
                items = [
                    n for n, name in zip(args.nodes, args.nodes_names, strict=True) if name in keep
                ]
            else:
                items = list(compress(args.nodes, passed))
            nodes = {"metadata": {}, "items": items}
    return orjson.dumps(
        {
            "Nodes": nodes,
            "NodeNames": node_names,
            "FailedNodes": dict(failed or {}),
            "FailedAndUnresolvableNodes": dict(unresolvable or {}),
            "Error": error,
        }
    )


def encode_priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """``HostPriorityList``: a bare array of ``{"Host", "Score"}``."""
    return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])


@dataclass(frozen=True, slots=True)
class Victims:
    """Pods to evict on one node, by UID, in the scheduler's order (decreasing priority)."""

    uids: list[str]
    num_pdb_violations: int
    priorities: list[int | None]
    """Pod priorities where the request carried full pods, else None per victim."""


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """A preempt request."""

    pod: JsonDict
    victims: dict[str, Victims]


def _victims(entry: Any, where: str, full: bool) -> Victims:
    if not isinstance(entry, dict):
        raise RequestError(f"{where} must be an object")
    folded = {k.lower(): v for k, v in entry.items()}
    pods = folded.get("pods") or []
    pdb = folded.get("numpdbviolations") or 0
    if not isinstance(pods, list) or not isinstance(pdb, int) or isinstance(pdb, bool):
        raise RequestError(f"{where}: Pods must be a list and NumPDBViolations an integer")
    uids: list[str] = []
    priorities: list[int | None] = []
    for i, pod in enumerate(pods):
        if not isinstance(pod, dict):
            raise RequestError(f"{where}.Pods[{i}] must be an object")
        if full:
            meta = pod.get("metadata")
            uid = meta.get("uid") if isinstance(meta, dict) else None
            spec = pod.get("spec")
            prio = spec.get("priority") if isinstance(spec, dict) else None
            priorities.append(prio if isinstance(prio, int) else None)
        else:
            uid = next((v for k, v in pod.items() if k.lower() == "uid"), None)
            priorities.append(None)
        if not isinstance(uid, str):
            raise RequestError(f"{where}.Pods[{i}]: the pod's UID must be a string")
        uids.append(uid)
    return Victims(uids, pdb, priorities)


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    """Parse ``ExtenderPreemptionArgs`` (meta victims, or full victims in objects mode)."""
    doc = _top(body, "preempt")
    pod = _pod(doc, "preempt")
    meta = doc.get("nodenametometavictims")
    full = doc.get("nodenametovictims")
    source, is_full = (meta, False) if meta is not None else (full, True)
    if source is None:
        return PreemptionArgs(pod, {})
    if not isinstance(source, dict):
        raise RequestError("preempt: NodeNameToMetaVictims must be an object")
    victims = {
        str(node): _victims(entry, f"preempt: victims of {node!r}", is_full)
        for node, entry in source.items()
    }
    return PreemptionArgs(pod, victims)


def encode_preemption_result(victims: Mapping[str, Victims]) -> bytes:
    """``ExtenderPreemptionResult``: always the meta (UID) form."""
    return orjson.dumps(
        {
            "NodeNameToMetaVictims": {
                node: {
                    "Pods": [{"UID": u} for u in v.uids],
                    "NumPDBViolations": v.num_pdb_violations,
                }
                for node, v in victims.items()
            }
        }
    )


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """A bind request."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def parse_binding_args(body: bytes) -> BindingArgs:
    """Parse ``ExtenderBindingArgs``."""
    doc = _top(body, "bind")
    values = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = doc.get(key.lower())
        if not isinstance(value, str):
            raise RequestError(f"bind: {key} must be a string")
        values[key.lower()] = value
    if not values["podname"] or not values["node"]:
        raise RequestError("bind: PodName and Node must not be empty")
    if not values["poduid"]:
        # kube-scheduler always sends the pod's uid; without it, any pod of that name would do.
        raise RequestError("bind: PodUID must not be empty: it names the one pod to bind")
    return BindingArgs(values["podname"], values["podnamespace"], values["poduid"], values["node"])


def encode_binding_result(error: str = "") -> bytes:
    """``ExtenderBindingResult``."""
    return orjson.dumps({"Error": error})
