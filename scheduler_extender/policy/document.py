"""The GPUSchedulingPolicy document (DESIGN.md §5): the seed's fields verbatim, ours optional.

Pure: parses an already-loaded mapping; reading files and YAML is the caller's job. ``spec`` is
built from ``SECTIONS``, each declared by its rule. Imports only pydantic and the rule modules.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from scheduler_extender.domain import QosClass
from scheduler_extender.errors import PolicyError
from scheduler_extender.names import POLICY_API_VERSION, POLICY_KIND, WHOLE_GPU_RESOURCES
from scheduler_extender.policy import remediation, staleness
from scheduler_extender.policy.base import ArgsModel, ArgsT, Section
from scheduler_extender.policy.qos import SECTION as QOS, WEIGHTS
from scheduler_extender.policy.rules import TERMS, fragmentation, memory, power, thermal, topology

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


PRIORITIZE = Section(
    "prioritize", PrioritizeArgs, "How scores become kube-scheduler's 0..10 points."
)

SECTIONS: Final[tuple[Section[Any], ...]] = (
    power.SECTION,
    thermal.SECTION,
    QOS,
    WEIGHTS,
    memory.SECTION,
    fragmentation.SECTION,
    staleness.SECTION,
    topology.SECTION,
    remediation.SECTION,
    PRIORITIZE,
)
"""Every section of ``spec``, in the order documents and the CRD list them."""


class _Spec(ArgsModel):
    """``spec``: every rule's arguments. Unknown keys are errors (a typo must not pass silently)."""

    def __getitem__(self, section: Section[ArgsT], /) -> ArgsT:
        """A rule's section (``base.Sections``): ``spec[thermal.SECTION]``."""
        args: ArgsT = getattr(self, section.name)
        return args

    @property
    def lends_idle_blocks(self) -> bool:
        """Whether idle blocks are lent.

        ``memory.idleRelease`` on, and remediation on and not a dry run, to take them back:
        never one without the other.
        """
        r = self[remediation.SECTION]
        return self[memory.SECTION].idle_release.enabled and r.enabled and not r.dry_run

    def notes(self) -> list[str]:
        """Settings that are valid but have no effect as set (said, never refused)."""
        out = []
        if self[memory.SECTION].idle_release.enabled and not self.lends_idle_blocks:
            out.append(
                "memory.idleRelease has no effect without remediation.enabled and dryRun: false "
                "(nothing is lent that could not be taken back)"
            )
        return out


_WHOLE_GPU_RESOURCES: Any = Field(
    WHOLE_GPU_RESOURCES,
    alias="wholeGPUResources",
    min_length=1,
    description="Extended resources that ask for whole GPUs (each vendor's device plugin's).",
)

if TYPE_CHECKING:
    from scheduler_extender.policy.qos import QosArgs, TermWeights
    from scheduler_extender.policy.remediation import RemediationArgs
    from scheduler_extender.policy.rules.fragmentation import FragmentationArgs
    from scheduler_extender.policy.rules.memory import MemoryArgs
    from scheduler_extender.policy.rules.power import PowerArgs
    from scheduler_extender.policy.rules.thermal import ThermalArgs
    from scheduler_extender.policy.rules.topology import TopologyArgs
    from scheduler_extender.policy.staleness import StaleArgs

    class PolicySpec(_Spec):
        """What type checkers see: the sections by name (a test keeps it equal to SECTIONS)."""

        power_saving: PowerArgs
        thermal_throttling: ThermalArgs
        qos: QosArgs
        weights: TermWeights
        memory: MemoryArgs
        fragmentation: FragmentationArgs
        stale_telemetry: StaleArgs
        topology: TopologyArgs
        remediation: RemediationArgs
        prioritize: PrioritizeArgs
        whole_gpu_resources: tuple[str, ...] = _WHOLE_GPU_RESOURCES

        def __init__(self, **sections: Any) -> None: ...  # every section has a default
else:
    PolicySpec = create_model(
        "PolicySpec",
        __base__=_Spec,
        __doc__=_Spec.__doc__,
        __module__=__name__,
        **{section.name: section.as_field() for section in SECTIONS},
        whole_gpu_resources=(tuple[str, ...], _WHOLE_GPU_RESOURCES),
    )


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
