"""deploy/prometheus/: the rule file is valid (``promtool check rules``), every alert is
unit-tested firing and not firing (``promtool test rules``), and every alert carries a
severity, a summary, a description and a ``runbook_url`` whose anchor is a section of
docs/operations.md. promtool comes from Debian's ``prometheus`` package
(.ci/services.d/prometheus.sh installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "servehall-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "servehall-rules.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run .ci/services.d/prometheus.sh (make test does)")
    return path


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading (lower case, punctuation dropped)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_promtool_checks_the_rules() -> None:
    r = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_pass() -> None:
    r = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=RULE_TESTS.parent,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in cases:
        for t in case.get("alert_rule_test", []):
            (fired if t["exp_alerts"] else quiet).add(t["alertname"])
    names = {a["alert"] for a in _alerts()}
    assert names - fired == set(), "alerts never tested firing"
    assert names - quiet == set(), "alerts never tested staying quiet"


def test_every_alert_has_severity_text_and_a_runbook_section() -> None:
    headings = {
        _anchor(h) for h in re.findall(r"^#{2,4} (.+)$", OPERATIONS.read_text(), flags=re.M)
    }
    for a in _alerts():
        assert a["labels"]["severity"] in {"critical", "warning", "info"}, a["alert"]
        ann = a["annotations"]
        assert ann["summary"] and ann["description"], a["alert"]
        doc, _, anchor = ann["runbook_url"].partition("#")
        assert doc == "docs/operations.md", a["alert"]
        assert anchor == a["alert"].lower(), a["alert"]
        assert anchor in headings, f"docs/operations.md has no section {a['alert']}"
