"""The GPUSchedulingPolicy CustomResourceDefinition, generated from the policy model.

``python -m scheduler_extender.policy.crd`` prints it; ``make crd`` writes
``manifests/crd/gpuschedulingpolicies.yaml``, and a test keeps that file equal to this output.
The spec's schema is pydantic's JSON Schema turned into the structural OpenAPI v3.0 schema the
API server wants: references inlined, ``null`` options as ``nullable``, boolean exclusive
bounds, class names as properties, no defaults (the extender applies them, so a stored
policy stays as written).
"""

from __future__ import annotations

import sys
from typing import Any

import yaml

from scheduler_extender.domain import QosClass
from scheduler_extender.names import POLICY_API_VERSION, POLICY_KIND, POLICY_PLURAL
from scheduler_extender.policy.document import PolicySpec

_DROPPED = frozenset({"title", "default"})


def structural(node: Any, defs: dict[str, Any]) -> Any:
    """One JSON Schema node as a structural OpenAPI v3.0 schema node."""
    if isinstance(node, list):
        return [structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return structural({**target, **rest}, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != {"type": "null"}]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) != 1:
            raise ValueError(f"a union other than X | None cannot be structural: {node}")
        merged = {**structural(options[0], defs), **structural(rest, defs)}
        return {**merged, "nullable": True} if len(options) < len(node["anyOf"]) else merged
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "additionalProperties" and value is False):
            continue
        if key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "description":
            out[key] = value.replace("``", "")
        elif key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        else:
            out[key] = structural(value, defs)
    names = out.pop("propertyNames", None)
    if names is not None:
        # A mapping keyed by an enum (a QoS class): one property per allowed key.
        item = out.pop("additionalProperties")
        out["properties"] = {name: item for name in names["enum"]}
    return out


def spec_schema() -> dict[str, Any]:
    """``spec``'s schema, structural, from ``PolicySpec``."""
    schema = PolicySpec.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    classes = [q.wire for q in sorted(QosClass, reverse=True)]
    defs[QosClass.__name__] = {"type": "string", "enum": classes}
    out: dict[str, Any] = structural(schema, defs)
    out.pop("description", None)
    # Unknown keys reach the extender, which refuses the policy naming them (Accepted=False),
    # instead of the API server dropping a typo without a word.
    out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition."""
    group, version = POLICY_API_VERSION.split("/")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{POLICY_PLURAL}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {
                "kind": POLICY_KIND,
                "listKind": f"{POLICY_KIND}List",
                "plural": POLICY_PLURAL,
                "singular": POLICY_KIND.lower(),
                "shortNames": ["gsp"],
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        column("MaxTemp", "number", ".spec.thermalThrottling.maxTemp"),
                        column("CoolDown", "string", ".spec.thermalThrottling.coolDownPeriod"),
                        column(
                            "Accepted",
                            "string",
                            '.status.conditions[?(@.type=="Accepted")].status',
                        ),
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "GPU scheduling policy read by the edgegpu extender (the "
                                "extender validates every field and reports problems in "
                                "status)."
                            ),
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


def column(name: str, kind: str, path: str, priority: int = 0) -> dict[str, Any]:
    """One ``additionalPrinterColumns`` entry (``priority`` 1: shown with ``-o wide`` only)."""
    out: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        out["priority"] = priority
    return out


class NoAliases(yaml.SafeDumper):
    """Writes a repeated schema out again rather than as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        """Never an alias."""
        return True


def render(doc: dict[str, Any] | None = None, model: str = "policy") -> str:
    """A CRD (the policy's by default) as the YAML file ``manifests/crd/`` holds."""
    header = f"# Generated from the {model} model by `make crd`; edit the model, not this file.\n"
    body = yaml.dump(
        crd() if doc is None else doc,
        Dumper=NoAliases,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    return header + body


if __name__ == "__main__":
    sys.stdout.write(render())
