"""``ansible/maintenance.yml`` run by ansible-core over local hosts, with the plugin recorded.

The play's own logic: one GPUMaintenance per host in serial waves (declare, wait, end), a
failed one kept and the play stopped before the next host. ``kubectl edgegpu`` is replaced by
a small program that records its arguments and fails ``wait`` for the host told; the e2e suite
runs the same play against the real control plane.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK = ROOT / "ansible" / "maintenance.yml"
ANSIBLE = Path(sys.executable).with_name("ansible-playbook")

pytestmark = pytest.mark.skipif(not ANSIBLE.exists(), reason="ansible-core is not installed")

RECORDER = """\
import json, sys
log, fail = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
with open(log, "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:2] == ["maintenance", "wait"] and args[2] == f"ansible-{fail}":
    print(f"ansible-{fail}: Failed  0/1 done  stopped on a failure")
    sys.exit(1)
print("ok")
"""


def play(
    tmp_path: Path, hosts: list[str], fail: str, **extra: object
) -> tuple[int, list[list[str]]]:
    recorder = tmp_path / "plugin.py"
    recorder.write_text(RECORDER)
    log = tmp_path / "calls.jsonl"
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[gpu]\n" + "".join(f"{h} ansible_connection=local\n" for h in hosts))
    variables = {
        "edgegpu_step": "driver-upgrade",
        "ansible_python_interpreter": sys.executable,
        "edgegpu_kubectl": [sys.executable, str(recorder), str(log), fail],
        **extra,
    }
    proc = subprocess.run(
        [str(ANSIBLE), "-i", str(inventory), str(PLAYBOOK), "-e", json.dumps(variables)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={
            **os.environ,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
            "ANSIBLE_HOME": str(tmp_path / "home"),
        },
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc.returncode, calls


def test_each_host_is_declared_waited_for_and_ended_in_turn(tmp_path: Path) -> None:
    rc, calls = play(tmp_path, ["edge-1", "edge-2"], fail="none", edgegpu_validation_level=2)
    assert rc == 0
    verbs = [(c[1], c[2]) for c in calls]
    assert verbs == [
        ("begin", "ansible-edge-1"),
        ("wait", "ansible-edge-1"),
        ("end", "ansible-edge-1"),
        ("begin", "ansible-edge-2"),
        ("wait", "ansible-edge-2"),
        ("end", "ansible-edge-2"),
    ]
    begin = calls[0]
    assert begin[begin.index("--node") + 1] == "edge-1"
    assert begin[begin.index("--step") + 1] == "driver-upgrade"
    assert begin[begin.index("--validation-level") + 1] == "2"


def test_the_first_failed_host_stops_the_play_and_keeps_its_maintenance(tmp_path: Path) -> None:
    rc, calls = play(tmp_path, ["edge-1", "edge-2", "edge-3"], fail="edge-2")
    assert rc != 0
    verbs = [(c[1], c[2]) for c in calls]
    assert verbs == [
        ("begin", "ansible-edge-1"),
        ("wait", "ansible-edge-1"),
        ("end", "ansible-edge-1"),
        ("begin", "ansible-edge-2"),
        ("wait", "ansible-edge-2"),
    ]  # not ended, and edge-3 untouched


def test_a_play_without_a_step_refuses_to_start(tmp_path: Path) -> None:
    rc, calls = play(tmp_path, ["edge-1"], fail="none", edgegpu_step="")
    assert rc != 0 and calls == []


def test_the_playbook_passes_ansibles_syntax_check(tmp_path: Path) -> None:
    assert shutil.which(str(ANSIBLE))
    proc = subprocess.run(
        [str(ANSIBLE), "--syntax-check", "-i", "localhost,", str(PLAYBOOK)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={
            **os.environ,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "ANSIBLE_HOME": str(tmp_path / "home"),
        },
    )
    assert proc.returncode == 0, proc.stderr
