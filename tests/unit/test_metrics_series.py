"""Labelled series created at zero before their first increment, and the library's error kinds listed."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import REGISTRY

from notifications_retry import delivery
from notifications_retry.observability import metrics

PACKAGE = Path(metrics.__file__).resolve().parents[1]


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_precreate_series_creates_every_counter_series_at_zero():
    channels, kinds, lanes = ["pc-email", "pc-sms"], ["pc-http_4xx", "pc-timeout"], ["pc-bulk"]
    assert sample("notifications_retry_sent_total", channel="pc-email") is None
    metrics.precreate_series(channels, kinds, lanes)
    for channel in channels:
        assert sample("notifications_retry_sent_total", channel=channel) == 0
        assert sample("notifications_retry_channel_disabled_total", channel=channel) == 0
        assert sample("notifications_retry_circuit_state", channel=channel) == 0
        for outcome in ("sent", "retry", "terminal"):
            assert sample("notifications_retry_processed_total", channel=channel, outcome=outcome) == 0
        for kind in kinds:
            assert sample("notifications_retry_terminal_failed_total", channel=channel, error_kind=kind) == 0
            assert sample("notifications_retry_retried_total", channel=channel, error_kind=kind) == 0
    assert sample("notifications_retry_lock_held", lane="pc-bulk") == 0
    assert sample("notifications_retry_cycle_duration_ms_count", lane="pc-bulk") == 0
    # No timestamp at zero: it would read as a tick completed in 1970.
    assert sample("notifications_retry_last_tick_completed_timestamp_seconds", lane="pc-bulk") is None


def test_precreate_series_keeps_what_was_already_counted():
    metrics.TERMINAL_FAILED.labels("pc-keep", "pc-kind").inc(3)
    metrics.CIRCUIT_STATE.labels("pc-keep").set(2)
    metrics.precreate_series(["pc-keep"], ["pc-kind"], [])
    assert sample("notifications_retry_terminal_failed_total", channel="pc-keep", error_kind="pc-kind") == 3
    assert sample("notifications_retry_circuit_state", channel="pc-keep") == 2


def test_builtin_error_kinds_list_every_kind_the_library_reports():
    # Kinds written in the source: `kind="x"`, `kind = "x"`, `default_kind = "x"`, and the worker's own.
    found = {delivery.EXHAUSTED, delivery.EXPIRED, delivery.UNDECODABLE}
    for path in [*sorted((PACKAGE / "providers").glob("*.py")), PACKAGE / "exceptions.py"]:
        found |= set(re.findall(r'\bkind\s*=\s*"([a-z0-9_]+)"', path.read_text()))
    assert len(found) > 10
    assert found <= set(metrics.BUILTIN_ERROR_KINDS), found - set(metrics.BUILTIN_ERROR_KINDS)
