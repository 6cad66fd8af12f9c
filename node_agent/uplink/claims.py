"""The node's allocated ResourceClaims, as the extender replicas list them for the DRA plugin.

Every replica is asked at once (``/v1/nodes/{node}/claims``) and their lists are merged, as for
the device plugin's assignments. Each row is checked; one not understood is left out (its claim
is then not prepared: kubelet asks again). Imports httpx and the standard library.
"""

from __future__ import annotations

import asyncio
import logging
import re

import httpx

from node_agent.dra.plugin import AllocatedClaim, ClaimDevice
from node_agent.uplink.answer import GPU_UUID_PATTERN
from node_agent.uplink.assignments import listed_rows
from node_agent.uplink.replicas import Replica

log = logging.getLogger("node_agent.push")

_UUID = re.compile(GPU_UUID_PATTERN)
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
MAX_MEMORY_MIB = 1 << 30


async def merged(
    client: httpx.AsyncClient, replicas: list[Replica], node: str, headers: dict[str, str], cap: int
) -> dict[str, AllocatedClaim] | None:
    """Every replica's claims merged by uid; None when no replica answers."""
    answers = await asyncio.gather(*(_listed(client, r, node, headers, cap) for r in replicas))
    found = [rows for rows in answers if rows is not None]
    if not found:
        return None
    out: dict[str, AllocatedClaim] = {}
    disputed: set[str] = set()
    for rows in found:
        for claim in rows:
            if out.setdefault(claim.uid, claim) != claim:
                disputed.add(claim.uid)
    for uid in disputed:
        # A replica behind the others may list a claim as it was before it was allocated
        # again: no GPU is given on a disagreement (kubelet asks again).
        log.warning("claim %s: the extender replicas list different devices: not prepared", uid)
        del out[uid]
    return out


async def _listed(
    client: httpx.AsyncClient, t: Replica, node: str, headers: dict[str, str], cap: int
) -> list[AllocatedClaim] | None:
    rows = await listed_rows(client, t, node, "claims", headers, cap)
    if rows is None:
        return None
    out: list[AllocatedClaim] = []
    bad = 0
    for row in rows:
        try:
            out.append(claim_of(row))
        except ValueError:
            bad += 1
    if bad:
        log.warning("claims from %s: %d rows not understood, left out", t.url, bad)
    return out


def claim_of(row: object) -> AllocatedClaim:
    """One row of the node's claims; ValueError for one not as the extender writes them."""
    if not isinstance(row, dict):
        raise ValueError("not an object")
    uid, namespace, name = row.get("uid"), row.get("namespace"), row.get("name")
    devices = row.get("devices")
    if not (
        all(isinstance(s, str) and 0 < len(s) <= 253 for s in (uid, namespace, name))
        and isinstance(devices, list)
        and len(devices) <= 64
    ):
        raise ValueError("a field is missing, of the wrong type or out of range")
    return AllocatedClaim(str(uid), str(namespace), str(name), tuple(_device(d) for d in devices))


def _device(d: object) -> ClaimDevice:
    if not isinstance(d, dict):
        raise ValueError("a device is not an object")
    request, pool, device, uuid = d.get("request"), d.get("pool"), d.get("device"), d.get("uuid")
    memory, share = d.get("memory_mib"), d.get("share_id")
    if not (
        all(isinstance(s, str) and s for s in (request, pool, device))
        and isinstance(device, str) and _NAME.fullmatch(device)
        and isinstance(uuid, str) and _UUID.fullmatch(uuid) and "," not in uuid
        and (memory is None or (isinstance(memory, int) and not isinstance(memory, bool)
                                and 0 < memory <= MAX_MEMORY_MIB))
        and (share is None or (isinstance(share, str) and 0 < len(share) <= 64))
    ):  # fmt: skip
        raise ValueError("a device field is missing, of the wrong type or out of range")
    return ClaimDevice(str(request), str(pool), device, uuid, memory, share)
