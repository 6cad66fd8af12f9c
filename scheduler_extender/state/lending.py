"""Idle memory blocks lent to best-effort pods (``spec.memory.idleRelease``).

A pod that is not best-effort lends, once its measured GPU memory has left a block idle for
``after``, as many whole blocks as keep its use below ``below`` of what it can still have
(``memory.idle_blocks``); fewer as its use grows. A GPU whose free memory drops under one block
lends nothing, and its pods' idle times start over: an owner must always find room to grow.
Best-effort pods may be placed in them (``combine`` adds them to a best-effort pod's room); the
agent's device plugin advertises them to kubelet, so kube-scheduler's count of the node's blocks
lets the borrowers in. As soon as an owner's blocks are no longer lent, ``borrowers_to_evict``
names the best-effort pods to evict (the leader's remediation round does it). Imports
``domain`` and ``policy`` only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduler_extender.domain import Assignment, QosClass
from scheduler_extender.policy.rules.memory import MemoryArgs, idle_blocks


class Lending:
    """Since when each pod has been idle, per node, and the blocks each GPU lends."""

    def __init__(self) -> None:
        self._since: dict[str, dict[str, float]] = {}
        """node → pod uid → when its use last went below the threshold (sample time)."""
        self._first: dict[str, float] = {}
        """node → the first report this extender saw of it (for lending)."""
        self._last: dict[str, float] = {}
        """node → the latest report lent blocks were worked out from."""
        self._by_gpu: dict[str, dict[int, int]] = {}
        """node → GPU index → blocks lent at that report."""

    def lent(
        self,
        node: str,
        sampled_at: float,
        owners: Mapping[int, list[tuple[Assignment, float]]],
        args: MemoryArgs,
        unread: Mapping[int, Iterable[str]] | None = None,
        free_mib: Mapping[int, float] | None = None,
    ) -> dict[int, int]:
        """Blocks lent per GPU index, from the pods on each GPU and their measured use (MiB).

        ``owners`` holds the block pods whose GPU processes the latest report attributes to
        them, with their use then; ``sampled_at`` is when that report came (only a new report
        moves the idle times on). A pod with no attributed process lends nothing: its use is
        not known. Best-effort pods lend nothing either: they borrow. A GPU whose memory the
        report could not read (``unread``: its index → the pods on it) keeps what it lent and
        its pods their idle times, until a report reads it again. ``free_mib``: each GPU's
        free memory in that report; under one block, the GPU lends nothing.
        """
        release = args.idle_release
        self._first.setdefault(node, sampled_at)
        self._last[node] = sampled_at
        before = self._since.get(node, {})
        since: dict[str, float] = {}
        out: dict[int, int] = {}
        for index, uids in (unread or {}).items():
            since.update({u: before[u] for u in uids if u in before})
            if (kept := self._by_gpu.get(node, {}).get(index)) is not None:
                out[index] = kept
        for index, pods in owners.items():
            if (free_mib or {}).get(index, float("inf")) < args.block_mib:
                continue  # a full GPU: its owners need every block they have
            for pod, used in pods:
                if pod.whole or not pod.mem_blocks or pod.qos is QosClass.BEST_EFFORT:
                    continue
                budget = float(pod.mem_blocks * args.block_mib)
                lendable = idle_blocks(budget, used, args.block_mib, release.below)
                if not lendable:
                    continue
                since[pod.pod_uid] = start = before.get(pod.pod_uid, sampled_at)
                if sampled_at - start >= release.after:
                    out[index] = out.get(index, 0) + lendable
        if since:
            self._since[node] = since
        else:
            self._since.pop(node, None)
        lent = {i: n for i, n in out.items() if n > 0}
        self._by_gpu[node] = lent
        return dict(lent)

    def settled(self, node: str, args: MemoryArgs) -> bool:
        """Whether this extender's reports of the node span ``after``.

        Only then can it know which of its pods are idle, and take lent blocks back: not right
        after a restart, when it has lent nothing yet either.
        """
        first, last = self._first.get(node), self._last.get(node)
        return first is not None and last is not None and last - first >= args.idle_release.after

    def forget(self, node: str) -> None:
        """The node is gone."""
        for kept in (self._since, self._first, self._last, self._by_gpu):
            kept.pop(node, None)


def borrowers_to_evict(on_gpu: list[Assignment], short_blocks: int) -> list[Assignment]:
    """The best-effort pods that give back ``short_blocks`` blocks, the latest assigned first.

    All of them if they hold fewer. ``on_gpu`` holds bound pods only (no reservations).
    """
    out: list[Assignment] = []
    left = short_blocks
    borrowers = [
        a for a in on_gpu if a.qos is QosClass.BEST_EFFORT and not a.whole and a.mem_blocks > 0
    ]
    for pod in sorted(borrowers, key=lambda a: (-a.assigned_at, a.pod_uid)):
        if left <= 0:
            break
        out.append(pod)
        left -= pod.mem_blocks
    return out
