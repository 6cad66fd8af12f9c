"""The GPUMaintenance CustomResourceDefinition, generated from its spec model.

``python -m scheduler_extender.remediation.crd`` prints it; ``make crd`` writes
``manifests/crd/gpumaintenances.yaml``, and a test keeps that file equal to this output. The
spec's schema is the model's, made structural as the policy's is; the status is the leader's
to write (``maintenance.Progress``) and kept as it is written.
"""

from __future__ import annotations

import sys
from typing import Any

from scheduler_extender.names import MAINTENANCE_API_VERSION, MAINTENANCE_KIND, MAINTENANCE_PLURAL
from scheduler_extender.policy import crd as policy_crd
from scheduler_extender.policy.crd import column, structural
from scheduler_extender.remediation.maintenance import MaintenanceSpec


def spec_schema() -> dict[str, Any]:
    """``spec``'s schema, structural, from ``MaintenanceSpec``."""
    schema = MaintenanceSpec.model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    out: dict[str, Any] = structural(schema, defs)
    out.pop("description", None)
    out.pop("title", None)
    # Unknown keys reach the extender, which refuses the maintenance naming them (Invalid),
    # instead of the API server dropping a typo (``pasued: true``) without a word.
    out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition."""
    group, version = MAINTENANCE_API_VERSION.split("/")
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{MAINTENANCE_PLURAL}.{group}"},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {
                "kind": MAINTENANCE_KIND,
                "listKind": f"{MAINTENANCE_KIND}List",
                "plural": MAINTENANCE_PLURAL,
                "singular": MAINTENANCE_KIND.lower(),
                "shortNames": ["gmaint"],
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        column("Step", "string", ".spec.step"),
                        column("Phase", "string", ".status.phase"),
                        column("Done", "integer", ".status.done"),
                        column("Nodes", "integer", ".status.total"),
                        column("Message", "string", ".status.message", priority=1),
                        column("Age", "date", ".metadata.creationTimestamp"),
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (
                                "A rolling GPU maintenance run by the edgegpu extender's "
                                "leader: each selected node cordoned, drained, its agent's "
                                "allow-listed step run, rebooted if the step asks, validated, "
                                "uncordoned; the first failure stops it (docs/maintenance.md)."
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
                            "required": ["spec"],
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    """The CRD as the YAML file ``manifests/crd/`` holds."""
    return policy_crd.render(crd(), "maintenance")


if __name__ == "__main__":
    sys.stdout.write(render())
