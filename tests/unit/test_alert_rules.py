"""The shipped Prometheus alert rules are valid and behave as their promtool unit tests say."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool() -> str:
    # Not a skip: the rules would ship untested. `make test` installs it first.
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing: run `bash scripts/ensure-promtool` (make test does)")
    return path


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_promtool_check_rules_accepts_the_rules_file():
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", "alerts_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_fail_when_a_threshold_drifts(tmp_path):
    # The unit tests must bite: move the backlog threshold and they fail.
    rules = (
        (RULES_DIR / "alerts.yml")
        .read_text()
        .replace(
            "max(notifications_failed_backlog_gauge) > 1000", "max(notifications_failed_backlog_gauge) > 5000"
        )
    )
    (tmp_path / "alerts.yml").write_text(rules)
    (tmp_path / "alerts_test.yml").write_text((RULES_DIR / "alerts_test.yml").read_text())
    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "NotificationsFailedBacklogHigh" in result.stdout + result.stderr


def _promtool_test_with(tmp_path: Path, old: str, new: str) -> subprocess.CompletedProcess[str]:
    """Run the shipped unit tests against alerts.yml with ``old`` replaced by ``new``."""
    rules = (RULES_DIR / "alerts.yml").read_text()
    assert old in rules
    (tmp_path / "alerts.yml").write_text(rules.replace(old, new))
    (tmp_path / "alerts_test.yml").write_text((RULES_DIR / "alerts_test.yml").read_text())
    return promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)


def test_a_provider_down_rule_on_open_only_misses_the_hanging_provider(tmp_path):
    # The rule as it was: each scraped half-open sample (a probe waiting for its timeout) resets `for:`.
    result = _promtool_test_with(tmp_path, ") > 0\n        for: 5m", ") == 2\n        for: 5m")
    assert result.returncode != 0
    assert "provider down when it hangs" in result.stdout + result.stderr


def test_a_terminal_spike_rule_on_increase_only_misses_a_series_first_scraped_at_n(tmp_path):
    rules = (RULES_DIR / "alerts.yml").read_text()
    expr = rules.split("- alert: NotificationsTerminalFailuresSpike", 1)[1].split("expr: >-\n", 1)[1]
    expr = expr.split("        labels:", 1)[0]
    plain = "          sum by (channel) (increase(notifications_retry_terminal_failed_total[15m])) > 20\n"
    result = _promtool_test_with(tmp_path, expr, plain)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "the first batch of dead letters on a channel" in out
    assert "a batch right after a restart, in a new pod" in out


def test_a_terminal_spike_rule_without_its_guard_pages_for_old_counters_after_a_gap(tmp_path):
    result = _promtool_test_with(tmp_path, "and on (instance) (up offset 15m == 1)", "")
    assert result.returncode != 0
    assert "no spike when Prometheus comes back" in result.stdout + result.stderr


def test_the_stuck_relay_rule_bites_on_its_threshold_its_wait_and_its_max(tmp_path):
    rule = "max(notifications_retry_outbox_oldest_unpublished_age_seconds) > 600"
    for changed in (
        rule.replace("> 600", "> 6000"),  # a threshold drifted: the stuck relay is missed
        rule.replace("max(", "sum("),  # summed over workers: it would say twice the age
    ):
        result = _promtool_test_with(tmp_path, rule, changed)
        assert result.returncode != 0
        assert "a stuck relay warns" in result.stdout + result.stderr
    without_wait = _promtool_test_with(tmp_path, rule + "\n        for: 5m", rule)
    assert without_wait.returncode != 0  # a relay that catches up within minutes would warn


def _rules() -> dict[str, str]:
    """Alert name → the text of its rule (no YAML library in the test extras; the layout is ours)."""
    chunks = (RULES_DIR / "alerts.yml").read_text().split("- alert: ")[1:]
    return {chunk.split("\n", 1)[0].strip(): chunk for chunk in chunks}


def test_every_card_alert_exists_on_exported_metrics_with_a_runbook():
    rules = _rules()
    assert "max(notifications_failed_backlog_gauge) > 1000" in rules["NotificationsFailedBacklogHigh"]
    assert "notifications_retry_terminal_failed_total" in rules["NotificationsTerminalFailuresSpike"]
    assert "notifications_retry_circuit_state" in rules["NotificationsProviderDown"]
    assert "notifications_retry_last_cycle_duration_ms) > 45000" in rules["NotificationsRetryTickTooLong"]
    assert (
        "notifications_retry_last_tick_completed_timestamp_seconds"
        in (rules["NotificationsRetryWorkerStalled"])
    )

    from notifications_retry.observability import metrics

    # Sample names a scrape shows: counters gain _total, histograms _bucket/_count/_sum.
    exported: set[str] = set()
    for obj in vars(metrics).values():
        name, kind = getattr(obj, "_name", None), getattr(obj, "_type", None)
        if name and kind:
            exported |= {name, f"{name}_total", f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    for alert, text in rules.items():
        used = set(re.findall(r"\bnotifications_[a-z_]+", text.split("annotations:")[0]))
        assert used, alert
        assert used <= exported, (alert, used - exported)
        runbook = re.search(r"runbook: (\S+)", text)
        assert runbook and (RULES_DIR.parents[1] / runbook.group(1)).is_file(), alert


def test_a_channel_disabled_rule_on_increase_only_misses_the_first_disable(tmp_path):
    # A channel's first automatic disable is a series born at 1: increase() reads 0 over it.
    rules = (RULES_DIR / "alerts.yml").read_text()
    expr = rules.split("- alert: NotificationsChannelDisabled", 1)[1].split("expr: >-\n", 1)[1]
    expr = expr.split("        labels:", 1)[0]
    plain = (
        "          sum by (channel) (increase("
        'notifications_retry_channel_health_changes_total{state="disabled"}[1h])) > 0\n'
    )
    result = _promtool_test_with(tmp_path, expr, plain)
    assert result.returncode != 0
    assert "a channel disabled by a worker started over an hour ago" in result.stdout + result.stderr
