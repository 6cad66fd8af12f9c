"""What pods asked for, kept for their bind, and the shape mix fragmentation scoring learns.

Bind gets only the pod's name: what the pod asked for at its last filter or prioritize is kept
here, for the ``DEMAND_CACHE_SIZE`` pods seen last. Imports ``domain`` and ``policy``.
"""

from __future__ import annotations

from collections import OrderedDict

from scheduler_extender.domain import PodDemand
from scheduler_extender.policy.rules.fragmentation import DemandMix, FragmentationArgs, MixLearner

DEMAND_CACHE_SIZE = 16_384


class Demands:
    """Pods' demands by uid (the latest last), and the mix of shapes learned from them."""

    def __init__(self, args: FragmentationArgs) -> None:
        self._by_pod: OrderedDict[str, PodDemand] = OrderedDict()
        self._mix = MixLearner(args)

    def set_args(self, args: FragmentationArgs) -> None:
        """Fragmentation settings in force: other ones learn the mix from the start."""
        if args != self._mix.args:
            self._mix = MixLearner(args)

    def remember(self, demand: PodDemand) -> None:
        """Keep what a pod asked for; a pod not seen before counts once in the mix (if on)."""
        if demand.uid not in self._by_pod and self._mix.args.enabled:
            self._mix.observe(demand)
        self._by_pod[demand.uid] = demand
        self._by_pod.move_to_end(demand.uid)
        while len(self._by_pod) > DEMAND_CACHE_SIZE:
            self._by_pod.popitem(last=False)

    @property
    def mix(self) -> DemandMix:
        """The shape mix in force (empty until fragmentation scoring has seen requests)."""
        return self._mix.mix

    def get(self, pod_uid: str) -> PodDemand | None:
        """What a pod asked for at its last filter or prioritize."""
        return self._by_pod.get(pod_uid)
