"""The shipped alert rules (configs/prometheus/r2cc-alerts.yaml) under Prometheus's own tools:
`promtool check rules`, and `promtool test rules` on series that must page and series that
must not, for every rule: r2cc-alerts.test.yaml (evaluated every second) and
r2cc-alerts-minutes.test.yaml (every minute, for the rules over minutes and hours) beside this
file. Operators can run the same: `promtool test rules tests/observability/*.test.yaml`."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = os.path.join(HERE, "..", "..", "configs", "prometheus", "r2cc-alerts.yaml")
CASES = [os.path.join(HERE, f) for f in ("r2cc-alerts.test.yaml", "r2cc-alerts-minutes.test.yaml")]

pytestmark = pytest.mark.requires("promtool")


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def _rule_names() -> list[str]:
    with open(RULES) as f:
        return [r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def test_the_rules_are_valid():
    out = _promtool("check", "rules", RULES)
    assert out.returncode == 0 and f"SUCCESS: {len(_rule_names())} rules found" in out.stdout, out.stdout + out.stderr


def test_every_rule_pages_when_it_must_and_not_otherwise():
    out = _promtool("test", "rules", *CASES)
    assert out.returncode == 0 and out.stdout.count("SUCCESS") == len(CASES), out.stdout + out.stderr


def test_every_rule_has_a_case_that_fires_and_one_that_does_not():
    cases = []
    for path in CASES:
        with open(path) as f:
            cases += [t for test in yaml.safe_load(f)["tests"] for t in test["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    quiet = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = set(_rule_names())
    assert names and names == fires == quiet, (names - fires, names - quiet)


def test_every_rule_names_its_severity_and_a_runbook_section():
    with open(RULES) as f:
        rules = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
    with open(os.path.join(HERE, "..", "..", "docs", "runbook.md")) as f:
        runbook = f.read().lower()
    for r in rules:
        assert r["labels"]["severity"] in ("info", "warning", "critical"), r["alert"]
        anchor = r["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor == r["alert"].lower() and f"## {r['alert'].lower()}" in runbook, r["alert"]
