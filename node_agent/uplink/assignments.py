"""The node's GPU assignments, as the extender replicas list them for the device plugin.

Every replica is asked at once (``/v1/nodes/{node}/assignments``) and their lists are merged: a
replica that did not bind a pod learns of it by its watch, and may not list it yet when kubelet
admits it. Each row is checked; one not understood is left out. Imports httpx and the standard
library.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re

import httpx

from node_agent.deviceplugin.devices import Assigned
from node_agent.deviceplugin.plugin import LOOKUP_TIMEOUT_S
from node_agent.uplink.answer import GPU_UUID_PATTERN
from node_agent.uplink.replicas import AnswerTooLarge, Replica, head, read_capped, tls_name

log = logging.getLogger("node_agent.push")

ASSIGNMENTS_TIMEOUT_S = 0.75 * LOOKUP_TIMEOUT_S
"""How long one replica may take to list the node's assignments: the others' answers still
count within the device plugin's wait."""


async def merged(
    client: httpx.AsyncClient, replicas: list[Replica], node: str, headers: dict[str, str], cap: int
) -> list[Assigned] | None:
    """Every replica's list merged, each pod once.

    None when no replica answers within ``ASSIGNMENTS_TIMEOUT_S``.
    """
    answers = await asyncio.gather(*(_listed(client, r, node, headers, cap) for r in replicas))
    found = [rows for rows in answers if rows is not None]
    if not found:
        return None
    merged: dict[str, Assigned] = {}
    for rows in found:
        for row in rows:
            merged.setdefault(row.uid, row)
    return list(merged.values())


async def listed_rows(
    client: httpx.AsyncClient, t: Replica, node: str, what: str, headers: dict[str, str], cap: int
) -> list[object] | None:
    """The list one replica answers to ``/v1/nodes/{node}/{what}``, under the key ``what``.

    None when it gives none (each failure logged).
    """
    url = t.url.removesuffix("/v1/telemetry") + f"/v1/nodes/{node}/{what}"
    extra = {"host": t.host} if t.host is not None else {}
    try:
        async with asyncio.timeout(ASSIGNMENTS_TIMEOUT_S):
            async with client.stream(
                "GET", url, headers={**headers, **extra}, extensions=tls_name(t)
            ) as resp:
                status = resp.status_code
                raw = await read_capped(resp, cap)
    except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
        log.warning("%s from %s: %s", what, url, f"{type(exc).__name__}: {exc}")
        return None
    if status != 200:
        log.warning("%s from %s: HTTP %d %s", what, url, status, head(raw, 200))
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        log.warning("%s from %s: not JSON: %s", what, url, str(exc)[:200])
        return None
    rows = doc.get(what) if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        log.warning("%s from %s: no list of %s", what, url, what)
        return None
    return rows


async def _listed(
    client: httpx.AsyncClient, t: Replica, node: str, headers: dict[str, str], cap: int
) -> list[Assigned] | None:
    """One replica's answer to ``/v1/nodes/{node}/assignments``; None when it gives none."""
    rows = await listed_rows(client, t, node, "assignments", headers, cap)
    if rows is None:
        return None
    out: list[Assigned] = []
    bad = 0
    for row in rows:
        try:
            found = _assigned(row)
        except ValueError:
            bad += 1
            continue
        if found is not None:
            out.append(found)
    if bad:
        # A pod left out has no GPU to be given: its allocation fails rather than guess.
        log.warning("assignments from %s: %d rows not understood, left out", t.url, bad)
    return out


def _number(value: object, bounds: tuple[float, float]) -> float | None:
    """``value`` as a float if it is a finite JSON number within ``bounds``, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range
        return None
    low, high = bounds
    return number if math.isfinite(number) and low <= number <= high else None


_UUID = re.compile(GPU_UUID_PATTERN)
MAX_BLOCKS_PER_POD = 65_536
"""The most blocks one assignment row may say a pod or a container asks."""


def _assigned(row: object) -> Assigned | None:
    """One row of the node's assignments; None for a pod given no GPU.

    Raises ValueError for a row that is not one as the extender writes them.
    """
    if not isinstance(row, dict):
        raise ValueError("not an object")
    uuids = row.get("gpu_uuids")
    if isinstance(uuids, list) and not uuids:
        return None
    uid, namespace, name = row.get("uid", ""), row.get("namespace", ""), row.get("name", "")
    blocks, phase, containers = row.get("blocks", 0), row.get("phase"), row.get("containers") or []
    assigned_at = _number(row.get("assigned_at"), (0.0, math.inf))
    if not (
        isinstance(uuids, list)
        and isinstance(uuids[0], str)
        and _UUID.fullmatch(uuids[0])
        and all(isinstance(s, str) and 0 < len(s) <= 253 for s in (uid, namespace, name))
        and _is_count(blocks)
        and assigned_at is not None
        and (phase is None or (isinstance(phase, str) and len(phase) <= 64))
        and isinstance(containers, list)
        and all(_is_count(b) for b in containers)
    ):
        raise ValueError("a field is missing, of the wrong type or out of range")
    return Assigned(uid, namespace, name, uuids[0], blocks, assigned_at, phase, tuple(containers))


def _is_count(value: object) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BLOCKS_PER_POD
    )
