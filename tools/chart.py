"""Writes the Helm chart ``charts/edgegpu`` from ``manifests/``: the manifests stay the one source.

``python -m tools.chart`` (``make chart``) writes it; a test keeps the committed chart equal to
this output, and the e2e suite renders it with a real ``helm`` and checks that, with default
values, it gives exactly the objects ``kubectl apply -k manifests/`` creates. Each value is an
exact text substitution in one manifest; one that no longer matches stops the build.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from node_agent.config import AgentSettings
from scheduler_extender import __version__
from scheduler_extender.domain import QosClass
from scheduler_extender.policy.document import PolicySpec

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
CHART = ROOT / "charts" / "edgegpu"
NAMESPACE = "edgegpu-system"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:v1.34.2"
SCHEDULER_IMAGE_DRA = "registry.k8s.io/kube-scheduler:v1.36.3"
"""The second scheduler's image with the DRA driver (overlays/dra/ patches it in)."""
AGENT_NODES = (
    ("feature.node.kubernetes.io/pci-10de.present", "true"),  # NFD: an NVIDIA PCI device
    ("nvidia.com/gpu.present", "true"),  # the GPU Operator's feature discovery
    ("accelerator", "nvidia-tesla"),  # the seed guide's label
    ("edgegpu.io/gpu", "true"),  # ours, for any other node
)
"""Labels of which any one makes a node the agent's (the DaemonSet's required node affinity)."""
AGENT_AFFINITY = (
    "      affinity:\n        nodeAffinity:\n"
    "          requiredDuringSchedulingIgnoredDuringExecution:\n"
    "            nodeSelectorTerms:       # any one: NVIDIA GPU nodes as NFD, the GPU Operator or "
    "the seed label them\n"
    + "".join(
        f"              - matchExpressions: [{{key: {k}, operator: In, values: "
        f"[{chr(34) + v + chr(34) if v == 'true' else v}]}}]\n"
        for k, v in AGENT_NODES
    )
)
"""The manifest's text of that affinity (replaced by the chart's values)."""


@dataclass(frozen=True)
class Value:
    """A manifest's text that a value of the chart replaces."""

    file: str
    old: str
    new: str


def _values() -> dict[str, Any]:
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    tags = {i["name"]: i["newTag"] for i in kustomization["images"]}
    policy = yaml.safe_load((MANIFESTS / "policy" / "default-policy.yaml").read_text())
    return {
        "extender": {
            "image": f"edgegpu/extender:{tags['edgegpu/extender']}",
            "replicas": 2,
        },
        "scheduler": {
            "enabled": True,
            "image": "",
            "replicas": 2,
        },
        "nodeAgent": {
            "image": f"edgegpu/node-agent:{tags['edgegpu/node-agent']}",
            "backend": "nvml",
            "nodeSelector": {},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": key, "operator": "In", "values": [value]}
                                ]
                            }
                            for key, value in AGENT_NODES
                        ]
                    }
                }
            },
            "tolerations": [{"operator": "Exists"}],
            "powerControl": True,
            "privileged": True,
            "protection": {
                "maxTempC": 85,
                "coolDownS": 300,
                "powerSaving": True,
                "powerSavingThresholdPct": 70,
            },
        },
        "tls": {"source": "helm"},
        "dra": {"enabled": False},
        "monitoring": {"enabled": False, "labels": {}},
        "prometheusNamespace": "monitoring",
        "policyName": policy["metadata"]["name"],
        "policy": policy["spec"],
    }


def _object(properties: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False, **more}


def _agent_flag(name: str) -> dict[str, Any]:
    """A protection value's schema: the agent's own flag's bounds (it refuses others at start)."""
    field = dict(AgentSettings.model_json_schema()["properties"][name])
    field.pop("title", None)
    field.pop("default", None)
    return field


def _values_schema() -> dict[str, Any]:
    """``values.schema.json``, the values the chart can render into a working release.

    helm refuses the others (a key it does not know, maxTemp 500, a typo in a policy section)
    before anything reaches the cluster. The policy's part is the policy model's own schema.
    """
    policy = PolicySpec.model_json_schema(by_alias=True)
    defs = policy.pop("$defs", {})
    # The classes by name, as documents give them (the model's enum holds their ranks).
    defs["QosClass"] = {"type": "string", "enum": [q.wire for q in QosClass]}
    image = {"type": "string", "minLength": 1}
    replicas = {"type": "integer", "minimum": 1}
    name = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "edgegpu chart values",
        **_object({
            "extender": _object({"image": image, "replicas": replicas}),
            "scheduler": _object({"enabled": {"type": "boolean"}, "image": {"type": "string"},
                                  "replicas": replicas}),
            "nodeAgent": _object({
                "image": image,
                "backend": {"enum": ["nvml", "amd", "intel", "jetson", "simulated"]},
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "affinity": {"type": "object"},
                "tolerations": {"type": "array", "items": {"type": "object"}},
                "powerControl": {"type": "boolean"},
                "privileged": {"type": "boolean"},
                "protection": _object({
                    "maxTempC": _agent_flag("max_temp_c"),
                    "coolDownS": _agent_flag("cool_down_s"),
                    "powerSaving": _agent_flag("power_saving"),
                    "powerSavingThresholdPct": _agent_flag("power_saving_threshold_pct"),
                }),
            }),
            "tls": _object({"source": {"enum": ["helm", "cert-manager", "existing"]}}),
            "dra": _object({"enabled": {"type": "boolean"}}),
            "monitoring": _object({
                "enabled": {"type": "boolean"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            }),
            "prometheusNamespace": name,
            "policyName": name,
            "policy": policy,
            "global": {"type": "object"},  # what Helm gives a chart used as a dependency
        }),
        "$defs": defs,
    }  # fmt: skip


_COMMENTS = {
    "extender:": "# The extender: every replica answers the scheduler; the elected one acts.",
    "tls:": "# mTLS between the scheduler and the extender, HTTPS from the agents (docs/install.md,"
    "\n# Security). source: helm makes a CA, the extender's and the scheduler's certificates and"
    "\n# the agents' CA ConfigMap on first install and keeps them on upgrades; cert-manager makes"
    "\n# cert-manager Certificates instead (create the edgegpu-ca ConfigMap as the docs say);"
    "\n# existing expects the Secrets edgegpu-extender-tls and edgegpu-scheduler-tls and the"
    "\n# ConfigMap edgegpu-ca to be there.",
    "prometheusNamespace:": "# The namespace whose Prometheus pods the NetworkPolicy lets "
    "reach the extender.",
    "dra:": "# enabled: true makes edgegpu a DRA driver (Kubernetes 1.36; docs/dra.md): "
    "the\n# DeviceClass gpu.edgegpu.io, ResourceSlices from the extender, kubelet's DRA plugin "
    "in the\n# agents in place of the device plugin.",
    "monitoring:": "# enabled: true adds the Prometheus Operator's objects (PodMonitors for the "
    "extender and the\n# agents, the alert rules) and the Grafana dashboard as a ConfigMap for "
    "Grafana's sidecar\n# (label grafana_dashboard: \"1\"); the Operator's CRDs must be there. "
    "labels go on the\n"
    "# PodMonitors and the PrometheusRule: kube-prometheus-stack selects only those labelled\n"
    "# release: <its release name>.",
    "scheduler:": "# The second kube-scheduler (schedulerName: edgegpu-scheduler). enabled: false "
    "when your\n# own scheduler calls the extender (docs/install.md). image: empty is"
    f"\n# {SCHEDULER_IMAGE}, or with dra.enabled {SCHEDULER_IMAGE_DRA}\n# (its allocator "
    "honours device taints and shared memory); match your control plane's minor.",
    "nodeAgent:": "# The DaemonSet on GPU nodes. backend: nvml, amd, intel, jetson or simulated. "
    "KubeEdge edge\n# nodes are tainted: the default toleration takes every taint. "
    "powerControl: false and\n# privileged: false run the agent read-only (it reports, "
    "it cannot cap a hot GPU).\n# affinity: any NVIDIA GPU node as NFD, the GPU Operator or the "
    "seed label it, or a node\n# labelled edgegpu.io/gpu=true (nodeSelector narrows it further)."
    "\n# protection: the agent's own "
    "thermal protection and power saving; the policy may make them\n# stricter, never looser "
    "(docs/policy.md).",
    "policyName:": "# The GPUSchedulingPolicy the extender follows, and its spec "
    "(docs/policy.md); e.g.\n# remediation: {enabled: true, dryRun: false} turns on the "
    "GPU fault loop.",
}


def _values_text() -> str:
    text = yaml.safe_dump(_values(), sort_keys=False, width=100)
    for key, comment in _COMMENTS.items():
        text = text.replace(f"\n{key}", f"\n{comment}\n{key}", 1)
        if text.startswith(key):
            text = f"{comment}\n{text}"
    return "# Generated by `make chart` from manifests/; docs/install.md says more.\n" + text


_SUBSTITUTIONS = (
    Value(
        "extender/deployment.yaml",
        "  replicas: 2\n",
        "  replicas: {{ .Values.extender.replicas }}\n",
    ),
    Value(
        "extender/deployment.yaml",
        "image: edgegpu/extender\n",
        "image: {{ .Values.extender.image | quote }}\n",
    ),
    Value(
        "scheduler/deployment.yaml",
        "  replicas: 2\n",
        "  replicas: {{ .Values.scheduler.replicas }}\n",
    ),
    Value(
        "scheduler/deployment.yaml",
        f"image: {SCHEDULER_IMAGE}\n",
        "image: {{ .Values.scheduler.image | default (ternary "
        f'"{SCHEDULER_IMAGE_DRA}" "{SCHEDULER_IMAGE}" .Values.dra.enabled) | quote }}}}\n',
    ),
    Value(
        "node-agent/daemonset.yaml",
        "image: edgegpu/node-agent\n",
        "image: {{ .Values.nodeAgent.image | quote }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        "--backend=nvml\n",
        "--backend={{ .Values.nodeAgent.backend }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        AGENT_AFFINITY,
        "      {{- with .Values.nodeAgent.nodeSelector }}\n      nodeSelector:\n"
        "        {{- toYaml . | nindent 8 }}\n      {{- end }}\n"
        "      {{- with .Values.nodeAgent.affinity }}\n      affinity:\n"
        "        {{- toYaml . | nindent 8 }}\n      {{- end }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        "        - operator: Exists        # every GPU node, tainted or not (KubeEdge's "
        "node-role.kubernetes.io/edge:NoSchedule too)\n",
        "        {{- toYaml .Values.nodeAgent.tolerations | nindent 8 }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        '{name: EDGEGPU_AGENT_POWER_CONTROL, value: "true"}',
        "{name: EDGEGPU_AGENT_POWER_CONTROL, value: {{ .Values.nodeAgent.powerControl | quote }}}",
    ),
    *(
        Value(
            "node-agent/daemonset.yaml",
            f'{{name: EDGEGPU_AGENT_{env}, value: "{default}"}}',
            f"{{name: EDGEGPU_AGENT_{env}, "
            f"value: {{{{ .Values.nodeAgent.protection.{key} | quote }}}}}}",
        )
        for env, key, default in (
            ("MAX_TEMP_C", "maxTempC", "85"),
            ("COOL_DOWN_S", "coolDownS", "300"),
            ("POWER_SAVING", "powerSaving", "true"),
            ("POWER_SAVING_THRESHOLD_PCT", "powerSavingThresholdPct", "70"),
        )
    ),
    Value(
        "node-agent/daemonset.yaml",
        "privileged: true\n",
        "privileged: {{ .Values.nodeAgent.privileged }}\n",
    ),
    Value(
        "extender/networkpolicy.yaml",
        "{kubernetes.io/metadata.name: monitoring}",
        "{kubernetes.io/metadata.name: {{ .Values.prometheusNamespace | quote }}}",
    ),
    Value(
        "extender/deployment.yaml",
        "{name: EDGEGPU_POLICY_NAME, value: edge-gpu-policy}",
        "{name: EDGEGPU_POLICY_NAME, value: {{ .Values.policyName | quote }}}",
    ),
    # dra.enabled: what overlays/dra/ patches in (docs/dra.md).
    Value(
        "extender/deployment.yaml",
        "            - {name: EDGEGPU_TOKEN_AUDIENCE, value: edgegpu}\n",
        "            - {name: EDGEGPU_TOKEN_AUDIENCE, value: edgegpu}\n"
        "            {{- if .Values.dra.enabled }}\n"
        '            - {name: EDGEGPU_DRA, value: "true"}\n'
        "            {{- end }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        "            - --device-plugin\n",
        "            - {{ if .Values.dra.enabled }}--dra{{ else }}--device-plugin{{ end }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        "            - {name: ca, mountPath: /etc/edgegpu-ca, readOnly: true}\n",
        "            - {name: ca, mountPath: /etc/edgegpu-ca, readOnly: true}\n"
        "            {{- if .Values.dra.enabled }}\n"
        "            - {name: plugins-registry, mountPath: /var/lib/kubelet/plugins_registry}\n"
        "            - {name: cdi, mountPath: /var/run/cdi}\n"
        "            {{- end }}\n",
    ),
    Value(
        "node-agent/daemonset.yaml",
        "          configMap: {name: edgegpu-ca, optional: true}\n",
        "          configMap: {name: edgegpu-ca, optional: true}\n"
        "        {{- if .Values.dra.enabled }}\n"
        "        - name: plugins-registry\n"
        "          hostPath: {path: /var/lib/kubelet/plugins_registry, type: DirectoryOrCreate}\n"
        "        - name: cdi\n"
        "          hostPath: {path: /var/run/cdi, type: DirectoryOrCreate}\n"
        "        {{- end }}\n",
    ),
    Value(
        "policy/default-policy.yaml",
        "  name: edge-gpu-policy\n",
        "  name: {{ .Values.policyName | quote }}\n",
    ),
)
"""Every value but the namespace (the release's), the policy's spec and the second scheduler."""


_HELM_TLS = """\
{{- if not (has .Values.tls.source (list "helm" "cert-manager" "existing")) }}
{{- fail (printf "tls.source is %q: it must be helm, cert-manager or existing"
      .Values.tls.source) }}
{{- end }}
{{- if eq .Values.tls.source "helm" }}
{{- /* Made on first install, kept as they are on upgrades (rotation: docs/install.md). */}}
{{- $ns := .Release.Namespace }}
{{- $server := lookup "v1" "Secret" $ns "edgegpu-extender-tls" }}
{{- $client := lookup "v1" "Secret" $ns "edgegpu-scheduler-tls" }}
{{- $bundle := lookup "v1" "ConfigMap" $ns "edgegpu-ca" }}
{{- $serverData := dict }}
{{- $clientData := dict }}
{{- $caCrt := "" }}
{{- if and $server $client $bundle }}
{{- $serverData = $server.data }}
{{- $clientData = $client.data }}
{{- $caCrt = index $bundle.data "ca.crt" }}
{{- else }}
{{- $ca := genCA "edgegpu-ca" 3650 }}
{{- $names := list (printf "edgegpu-extender.%s.svc" $ns)
      (printf "edgegpu-extender-headless.%s.svc" $ns) }}
{{- $cert := genSignedCert "edgegpu-extender" nil $names 3650 $ca }}
{{- $scheduler := genSignedCert "edgegpu-scheduler" nil nil 3650 $ca }}
{{- $serverData = dict "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc)
      "ca.crt" ($ca.Cert | b64enc) }}
{{- $clientData = dict "tls.crt" ($scheduler.Cert | b64enc) "tls.key" ($scheduler.Key | b64enc)
      "ca.crt" ($ca.Cert | b64enc) }}
{{- $caCrt = $ca.Cert }}
{{- end }}
{{- range $name, $data := dict "edgegpu-extender-tls" $serverData
      "edgegpu-scheduler-tls" $clientData }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels: {app.kubernetes.io/part-of: edgegpu}
  annotations: {helm.sh/resource-policy: keep}
type: kubernetes.io/tls
data:
  {{- toYaml $data | nindent 2 }}
---
{{- end }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: edgegpu-ca
  namespace: {{ $ns }}
  labels: {app.kubernetes.io/part-of: edgegpu}
  annotations: {helm.sh/resource-policy: keep}
data:
  ca.crt: {{ $caCrt | quote }}
{{- end }}
"""
"""The certificates Helm makes itself (``tls.source: helm``, the default)."""


_DASHBOARD = """---
apiVersion: v1
kind: ConfigMap
metadata:
  name: edgegpu-grafana-dashboard
  namespace: {{ .Release.Namespace }}
  labels: {grafana_dashboard: "1"}
data:
  grafana-dashboard.json: |-
    {{- .Files.Get "dashboards/edgegpu.json" | nindent 4 }}
"""
"""The dashboard ConfigMap that manifests/monitoring/'s configMapGenerator makes."""


def _template(path: str, *, literal_braces: bool = False) -> str:
    """One manifest as a template: values substituted, the release's namespace throughout.

    ``literal_braces``: the manifest's own ``{{ }}`` (Prometheus' alert templates) are written
    so that Helm renders them as they are.
    """
    text = (MANIFESTS / path).read_text()
    if literal_braces:
        text = text.replace("{{", "\0open").replace("}}", "\0close")
        text = text.replace("\0open", '{{ "{{" }}').replace("\0close", '{{ "}}" }}')
    elif "{{" in text:
        raise ValueError(f"manifests/{path} holds '{{{{', which Helm would read as a template")
    for sub in _SUBSTITUTIONS:
        if sub.file == path:
            if text.count(sub.old) != 1:
                raise ValueError(f"manifests/{path}: {sub.old!r} is not there exactly once")
            text = text.replace(sub.old, sub.new)
    if path == "policy/default-policy.yaml":
        head, _, _ = text.partition("\nspec:\n")
        text = head + "\nspec:\n  {{- toYaml .Values.policy | nindent 2 }}\n"
    if path.startswith("scheduler/"):  # the second scheduler is optional
        text = "{{- if .Values.scheduler.enabled }}\n" + text + "{{- end }}\n"
    return text.replace(NAMESPACE, "{{ .Release.Namespace }}")


_PART_OF = "  labels: {app.kubernetes.io/part-of: edgegpu}\n"


def _monitoring_labels(text: str) -> str:
    """The monitoring objects' labels with ``monitoring.labels`` added (a Prometheus's selector)."""
    if _PART_OF not in text:
        raise ValueError("a monitoring manifest lost its part-of label")
    return text.replace(
        _PART_OF,
        "  labels:\n    app.kubernetes.io/part-of: edgegpu\n"
        "    {{- with .Values.monitoring.labels }}{{ toYaml . | nindent 4 }}{{- end }}\n",
    )


def files() -> dict[str, str]:
    """The chart's files by path inside the chart."""
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    out = {
        "Chart.yaml": yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "edgegpu",
                "description": "GPU-aware scheduling, telemetry and fault handling for edge "
                "Kubernetes clusters: the kube-scheduler extender, a second scheduler that "
                "calls it, and the node agent.",
                "type": "application",
                "version": __version__,
                "appVersion": __version__,
            },
            sort_keys=False,
            width=100,
        ),
        "values.yaml": _values_text(),
        "values.schema.json": json.dumps(_values_schema(), indent=2, ensure_ascii=False) + "\n",
        "crds/gpuschedulingpolicies.yaml": (
            MANIFESTS / "crd" / "gpuschedulingpolicies.yaml"
        ).read_text(),
        "crds/gpumaintenances.yaml": (MANIFESTS / "crd" / "gpumaintenances.yaml").read_text(),
        "templates/tls-helm.yaml": _HELM_TLS,
        "dashboards/edgegpu.json": (
            MANIFESTS / "monitoring" / "grafana-dashboard.json"
        ).read_text(),
        "templates/monitoring.yaml": (
            "# Generated by `make chart` from manifests/monitoring/.\n"
            "{{- if .Values.monitoring.enabled }}\n"
            + _monitoring_labels(_template("monitoring/prometheusrule.yaml", literal_braces=True))
            + "---\n"
            + _monitoring_labels(_template("monitoring/podmonitors.yaml"))
            + _DASHBOARD
            + "{{- end }}\n"
        ),
        "templates/dra.yaml": (
            "# Generated by `make chart` from overlays/dra/.\n"
            "{{- if .Values.dra.enabled }}\n"
            + (ROOT / "overlays" / "dra" / "deviceclass.yaml").read_text()
            + "---\n"
            + (ROOT / "overlays" / "dra" / "rbac.yaml")
            .read_text()
            .replace(NAMESPACE, "{{ .Release.Namespace }}")
            + "---\n"
            + (ROOT / "overlays" / "dra" / "admission.yaml").read_text()
            + "{{- end }}\n"
        ),
        "templates/tls-cert-manager.yaml": (
            "# Generated by `make chart` from manifests/cert-manager/certificates.yaml.\n"
            '{{- if eq .Values.tls.source "cert-manager" }}\n'
            + _template("cert-manager/certificates.yaml")
            + "{{- end }}\n"
        ),
    }
    for resource in kustomization["resources"]:
        if resource == "namespace.yaml":
            continue  # the release's namespace: helm install --create-namespace
        name = resource.replace("/", "-")
        out[f"templates/{name}"] = (
            "# Generated by `make chart` from manifests/"
            + resource
            + "; edit that file.\n"
            + _template(resource)
        )
    return out


def write(chart: Path = CHART) -> None:
    """Write the chart, removing files it no longer has."""
    wanted = files()
    if chart.exists():
        for path in sorted(chart.rglob("*"), reverse=True):
            rel = path.relative_to(chart).as_posix()
            if path.is_file() and rel not in wanted:
                path.unlink()
    for rel, text in wanted.items():
        path = chart / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else CHART)
