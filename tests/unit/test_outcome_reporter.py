"""OutcomeReporter: each committed outcome logged, the counters moved by what was recorded."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from notifications_retry import signals
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.rules.outcomes import RETRY, SENT, TERMINAL, Outcome
from tests.support.records import claimed_record


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"notifications_retry_{name}_total", labels) or 0.0


def _outcome(result: str, kind: str = "") -> Outcome:
    return Outcome(claimed_record(channel_id=7), result, error_kind=kind, error="boom" if kind else "")


def _reporter(stats: TickStats) -> OutcomeReporter:
    reporter = OutcomeReporter({7: "reporter-hook"})
    reporter.begin_tick(stats, structlog.get_logger("notifications_retry.worker"))
    return reporter


def test_a_batch_is_logged_one_event_each_and_counted_by_label_set() -> None:
    before = {
        "processed_sent": _value("processed", channel="reporter-hook", outcome=SENT),
        "processed_retry": _value("processed", channel="reporter-hook", outcome=RETRY),
        "sent": _value("sent", channel="reporter-hook"),
        "retried": _value("retried", channel="reporter-hook", error_kind="http_5xx"),
    }
    stats = TickStats(run_id="reporter")
    batch = [_outcome(SENT), _outcome(RETRY, "http_5xx"), _outcome(SENT), _outcome(SENT)]
    with capture_logs() as logs:
        _reporter(stats).record_all(batch)
    assert [e["event"] for e in logs] == ["item-sent", "item-retried", "item-sent", "item-sent"]
    assert [e["notification_id"] for e in logs] == [str(o.record.id) for o in batch]
    assert (stats.processed, stats.sent, stats.retried) == (4, 3, 1)
    assert _value("processed", channel="reporter-hook", outcome=SENT) - before["processed_sent"] == 3
    assert _value("processed", channel="reporter-hook", outcome=RETRY) - before["processed_retry"] == 1
    assert _value("sent", channel="reporter-hook") - before["sent"] == 3
    assert _value("retried", channel="reporter-hook", error_kind="http_5xx") - before["retried"] == 1


def test_a_raising_terminal_failure_receiver_leaves_what_was_recorded_counted() -> None:
    """Counted up to and with the outcome whose receiver raised, as they were logged; none after."""

    def receiver(**kwargs: Any) -> None:
        raise RuntimeError("a receiver of the project's own failed")

    before_sent = _value("sent", channel="reporter-hook")
    before_terminal = _value("terminal_failed", channel="reporter-hook", error_kind="rejected")
    stats = TickStats(run_id="reporter")
    signals.terminal_failure.connect(receiver)
    try:
        with pytest.raises(RuntimeError), capture_logs() as logs:
            _reporter(stats).record_all([_outcome(SENT), _outcome(TERMINAL, "rejected"), _outcome(SENT)])
    finally:
        signals.terminal_failure.disconnect(receiver)
    assert [e["event"] for e in logs] == ["item-sent", "item-failed-terminal"]
    assert _value("sent", channel="reporter-hook") - before_sent == 1
    assert _value("terminal_failed", channel="reporter-hook", error_kind="rejected") - before_terminal == 1
