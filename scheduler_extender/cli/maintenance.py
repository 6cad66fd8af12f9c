"""``kubectl edgegpu maintenance``: declare, watch, pause, resume, abort and end GPU maintenances.

It reads and writes ``GPUMaintenance`` objects through the API server with the user's
kubeconfig (the extender's leader runs them): the same as ``kubectl apply`` / ``patch`` /
``delete`` on them, with a table of where each node is and a ``wait`` whose exit status says how
a maintenance ended (0 Succeeded; 1 Failed, Aborted, Invalid, or the timeout).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from scheduler_extender.cli.reach import Cluster, PluginError
from scheduler_extender.names import MAINTENANCE_API_VERSION, MAINTENANCE_KIND, MAINTENANCE_PLURAL

PATH = f"/apis/{MAINTENANCE_API_VERSION}/{MAINTENANCE_PLURAL}"
FINISHED = ("Succeeded", "Failed", "Aborted", "Invalid")


def add_commands(sub: Any, options: Callable[[argparse.ArgumentParser], None]) -> None:
    """The ``maintenance`` command and its sub-commands."""
    pm = sub.add_parser("maintenance", help="rolling GPU maintenances (docs/maintenance.md)")
    options(pm)
    verbs = pm.add_subparsers(dest="verb", required=True)
    ls = verbs.add_parser("list", help="every maintenance and its progress")
    show = verbs.add_parser("show", help="one maintenance, node by node")
    show.add_argument("name")
    begin = verbs.add_parser("begin", help="declare a maintenance (the leader starts it)")
    begin.add_argument("name")
    begin.add_argument("--step", required=True, help="a step name in the agents' allow-lists")
    begin.add_argument("--node", action="append", default=[], help="a node (repeatable)")
    begin.add_argument("--selector", action="append", default=[], metavar="KEY=VALUE",
                       help="a label the nodes carry (repeatable; none with no --node: every "
                       "GPU node)")  # fmt: skip
    begin.add_argument("--max-unavailable", type=int, default=1)
    begin.add_argument("--validation-level", type=int, default=1, choices=[1, 2, 3])
    begin.add_argument("--step-timeout", help="e.g. 45m (default 1h)")
    begin.add_argument("--driver-version", help="the target: nodes at it are skipped, and a "
                       "node must report it after its step")  # fmt: skip
    wait = verbs.add_parser("wait", help="until it ends: exit 0 if it succeeded, else 1")
    wait.add_argument("name")
    wait.add_argument("--timeout", type=float, default=7200.0, metavar="SECONDS")
    wait.add_argument("--interval", type=float, default=5.0, metavar="SECONDS")
    commands = [ls, show, begin, wait]
    for verb, text in (("pause", "freeze it where it is"), ("resume", "go on after a pause"),
                       ("abort", "start no new node; nodes past their drain finish"),
                       ("end", "delete it (aborted first if it is running)")):  # fmt: skip
        cmd = verbs.add_parser(verb, help=text)
        cmd.add_argument("name")
        commands.append(cmd)
    for cmd in commands:
        options(cmd)


def run(c: Cluster, ns: argparse.Namespace, table: Callable[..., str]) -> tuple[Any, str, int]:
    """One maintenance command: (data for -o json, text, exit status)."""
    verb = ns.verb
    if verb == "list":
        items = c.kube(PATH).get("items") or []
        rows = [[_name(m), (m.get("spec") or {}).get("step"), _status(m).get("phase", "-"),
                 f"{_status(m).get('done', 0)}/{_status(m).get('total', '-')}",
                 _status(m).get("message", "")] for m in items]  # fmt: skip
        return items, table(rows, ["NAME", "STEP", "PHASE", "DONE", "MESSAGE"]), 0
    if verb == "show":
        doc = c.kube(f"{PATH}/{ns.name}")
        return doc, _show(doc, table), 0
    if verb == "begin":
        body = {"apiVersion": MAINTENANCE_API_VERSION, "kind": MAINTENANCE_KIND,
                "metadata": {"name": ns.name}, "spec": _spec(ns)}  # fmt: skip
        doc = c.kube_write("POST", PATH, body)
        return doc, f"gpumaintenance {ns.name} created: the leader starts it", 0
    if verb == "wait":
        return _wait(c, ns, table)
    if verb == "end":
        c.kube_write("PATCH", f"{PATH}/{ns.name}", {"spec": {"abort": True}})
        doc = c.kube_write("DELETE", f"{PATH}/{ns.name}")
        return doc, f"gpumaintenance {ns.name} deleted (its nodes are let go first)", 0
    change = {"pause": {"paused": True}, "resume": {"paused": False}, "abort": {"abort": True}}
    doc = c.kube_write("PATCH", f"{PATH}/{ns.name}", {"spec": change[verb]})
    return doc, f"gpumaintenance {ns.name}: {verb} asked", 0


def _spec(ns: argparse.Namespace) -> dict[str, Any]:
    selector: dict[str, str] = {}
    for item in ns.selector:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise PluginError(f"--selector {item!r}: write KEY=VALUE")
        selector[key] = value
    spec: dict[str, Any] = {"step": ns.step, "maxUnavailable": ns.max_unavailable,
                            "validationLevel": ns.validation_level}  # fmt: skip
    if ns.node:
        spec["nodes"] = list(ns.node)
    if selector or not ns.node:
        spec["nodeSelector"] = selector
    if ns.step_timeout:
        spec["stepTimeout"] = ns.step_timeout
    if ns.driver_version:
        spec["driverVersion"] = ns.driver_version
    return spec


def _wait(c: Cluster, ns: argparse.Namespace, table: Callable[..., str]) -> tuple[Any, str, int]:
    deadline = time.monotonic() + ns.timeout
    while True:
        doc = c.kube(f"{PATH}/{ns.name}")
        phase = _status(doc).get("phase")
        if phase in FINISHED:
            return doc, _show(doc, table), 0 if phase == "Succeeded" else 1
        if time.monotonic() >= deadline:
            return doc, f"{_show(doc, table)}\nnot finished in {ns.timeout:g} s", 1
        time.sleep(ns.interval)


def _show(doc: dict[str, Any], table: Callable[..., str]) -> str:
    status = _status(doc)
    nodes = status.get("nodes") or {}
    rows = [[n, e.get("state"), e.get("since"), e.get("message")] for n, e in sorted(nodes.items())]
    done = f"{status.get('done', 0)}/{status.get('total', '-')} done"
    phase = status.get("phase", "not started")
    head = f"{_name(doc)}: {phase}  {done}  {status.get('message', '')}"
    return head + ("\n" + table(rows, ["NODE", "STATE", "SINCE", "MESSAGE"]) if rows else "")


def _name(doc: dict[str, Any]) -> str:
    return str((doc.get("metadata") or {}).get("name", ""))


def _status(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc.get("status") or {})
