"""The GPUSchedulingPolicy document (DESIGN.md §5): the seed's fields verbatim, ours optional.

Pure: parses an already-loaded mapping; reading files and YAML is the caller's job.
Imports only pydantic and the rule modules.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler_extender.domain import QosClass
from scheduler_extender.errors import PolicyError
from scheduler_extender.names import POLICY_API_VERSION, POLICY_KIND, WHOLE_GPU_RESOURCES
from scheduler_extender.policy.base import ArgsModel
from scheduler_extender.policy.qos import QosArgs, TermWeights
from scheduler_extender.policy.remediation import RemediationArgs
from scheduler_extender.policy.rules import TERMS
from scheduler_extender.policy.rules.fragmentation import FragmentationArgs
from scheduler_extender.policy.rules.memory import MemoryArgs
from scheduler_extender.policy.rules.power import PowerArgs
from scheduler_extender.policy.rules.thermal import ThermalArgs
from scheduler_extender.policy.rules.topology import TopologyArgs
from scheduler_extender.policy.staleness import StaleArgs

_SAVING = TERMS.index("powerSaving")


class PrioritizeArgs(ArgsModel):
    """``spec.prioritize`` (ours): how scores become kube-scheduler's 0..10 points."""

    relative_step: float | None = Field(
        None,
        alias="relativeStep",
        gt=0,
        le=1,
        description=(
            "Unset: points = round(10 × score). Set: the best candidate of a request gets 10 "
            "and a node loses one point per step of score below it (finer choices, e.g. 0.01)."
        ),
    )


class PolicySpec(ArgsModel):
    """``spec``: every rule's arguments. Unknown keys are errors (a typo must not pass silently)."""

    power_saving: PowerArgs = Field(
        default_factory=PowerArgs,
        alias="powerSaving",
        description="Low-QoS pods pack onto active GPUs; agents lower idle GPUs' clocks.",
    )
    thermal_throttling: ThermalArgs = Field(
        default_factory=ThermalArgs,
        alias="thermalThrottling",
        description="Hot GPUs take no pods until cooled down; long-hot GPUs shed pods.",
    )
    qos: QosArgs = Field(
        default_factory=QosArgs, description="QoS classes of pods and each class's term weights."
    )
    weights: TermWeights = Field(
        default_factory=TermWeights,
        description="Multipliers applied on top of every class's weights.",
    )
    memory: MemoryArgs = Field(
        default_factory=MemoryArgs,
        description="GPU memory blocks (edgegpu.io/gpu-mem-block) and their budgets.",
    )
    fragmentation: FragmentationArgs = Field(
        default_factory=FragmentationArgs,
        description="Score placements by the GPU fragmentation they leave (FGD).",
    )
    stale_telemetry: StaleArgs = Field(
        default_factory=StaleArgs,
        alias="staleTelemetry",
        description="When a node's telemetry is too old, and which classes still pass it.",
    )
    topology: TopologyArgs = Field(
        default_factory=TopologyArgs, description="Racks and RDMA for pods of one job group."
    )
    remediation: RemediationArgs = Field(
        default_factory=RemediationArgs,
        description="The fault loop: cordon, evict, self-test, reboot decision, uncordon.",
    )
    prioritize: PrioritizeArgs = Field(
        default_factory=PrioritizeArgs,
        description="How scores become kube-scheduler's 0..10 points.",
    )
    whole_gpu_resources: tuple[str, ...] = Field(
        WHOLE_GPU_RESOURCES,
        alias="wholeGPUResources",
        min_length=1,
        description="Extended resources that ask for whole GPUs (each vendor's device plugin's).",
    )

    @property
    def lends_idle_blocks(self) -> bool:
        """Whether idle blocks are lent.

        ``memory.idleRelease`` on, and remediation on and not a dry run, to take them back:
        never one without the other.
        """
        r = self.remediation
        return self.memory.idle_release.enabled and r.enabled and not r.dry_run

    def notes(self) -> list[str]:
        """Settings that are valid but have no effect as set (said, never refused)."""
        out = []
        if self.memory.idle_release.enabled and not self.lends_idle_blocks:
            out.append(
                "memory.idleRelease has no effect without remediation.enabled and dryRun: false "
                "(nothing is lent that could not be taken back)"
            )
        return out


class PolicyMetadata(BaseModel):
    """``metadata``: only the name matters; the rest of a custom resource's metadata is kept."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str = "default"


class Policy(BaseModel):
    """A validated GPUSchedulingPolicy. Status and other top-level keys of a CR are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    api_version: Literal["kepler.io/v1"] = Field(POLICY_API_VERSION, alias="apiVersion")
    kind: Literal["GPUSchedulingPolicy"] = POLICY_KIND
    metadata: PolicyMetadata = Field(default_factory=PolicyMetadata)
    spec: PolicySpec = Field(default_factory=PolicySpec)

    def class_weights(self, qos: QosClass) -> tuple[float, ...]:
        """Effective term weights for a class: class weights × global multipliers."""
        return self._weights_by_class[qos]

    @functools.cached_property
    def _weights_by_class(self) -> dict[QosClass, tuple[float, ...]]:
        # Worked out once per policy (a frozen document): every request asks for them.
        mult = self.spec.weights.as_tuple()
        out = {}
        for qos in QosClass:
            base = self.spec.qos.class_weights(qos).as_tuple()
            weights = tuple(b * m for b, m in zip(base, mult, strict=True))
            if not (self.spec.power_saving.enabled and qos.packs):
                # powerSaving packs low-QoS work onto active GPUs only when it is switched on.
                weights = (*weights[:_SAVING], 0.0, *weights[_SAVING + 1 :])
            out[qos] = weights
        return out

    def describe(self) -> dict[str, Any]:
        """The document as served by ``GET /debug/policy`` (QoS classes by name)."""
        doc = self.model_dump(mode="json", by_alias=True)
        spec = doc["spec"]
        spec["qos"]["defaultClass"] = self.spec.qos.default_class.wire
        spec["qos"]["weights"] = {
            qos.wire: self.spec.qos.class_weights(qos).model_dump(by_alias=True)
            for qos in sorted(QosClass, reverse=True)
        }
        spec["staleTelemetry"]["failOpen"] = {
            qos.wire: self.spec.stale_telemetry.fail_open.get(qos, False)
            for qos in sorted(QosClass, reverse=True)
        }
        return doc


DEFAULT_POLICY = Policy()


def parse_policy(document: Any) -> Policy:
    """Validate a loaded document; raises ``PolicyError`` listing every problem at once."""
    if not isinstance(document, dict):
        raise PolicyError(
            [
                "not a GPUSchedulingPolicy: YAML or JSON with apiVersion, kind and spec keys "
                f"was expected, and this file parses as a {type(document).__name__}"
            ]
        )
    try:
        return Policy.model_validate(document)
    except ValidationError as exc:
        raise PolicyError(
            [
                f"{'.'.join(str(p) for p in err['loc']) or '(document)'}: {err['msg']}"
                for err in exc.errors(include_url=False, include_input=False)
            ]
        ) from None
