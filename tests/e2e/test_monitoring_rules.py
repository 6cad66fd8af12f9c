"""The alert rules with Prometheus' own promtool (built from the Go module proxy, as the
control plane is): ``check rules``, and ``test rules`` on series as the agent exports them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.gotools import PROMTOOL, build_go_tool

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "monitoring"


def test_promtool_checks_and_unit_tests_the_alert_rules(tmp_path: Path) -> None:
    promtool = build_go_tool(*PROMTOOL)
    rule = yaml.safe_load((ROOT / "manifests/monitoring/prometheusrule.yaml").read_text())
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "rules-test.yaml").write_text((TESTS / "rules-test.yaml").read_text())
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    count = sum(len(g["rules"]) for g in rule["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in check.stdout, check.stdout
    test = subprocess.run([promtool, "test", "rules", "rules-test.yaml"], cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    assert test.returncode == 0, test.stdout + test.stderr
