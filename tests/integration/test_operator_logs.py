"""Logs an operator can filter: fallbacks as structured events of the tick, channel-disabled on change."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.runtime.clock import ManualClock
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status


def _due(clock: ManualClock, channel: ChannelConfig, n: int) -> list[NotificationEntity]:
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=9),
        )
        for _ in range(n)
    ]


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


def _skipped(channel: str) -> float:
    return (
        REGISTRY.get_sample_value("notifications_retry_channel_disabled_total", {"channel": channel}) or 0.0
    )


def test_channel_disabled_is_logged_when_the_state_changes_and_counted_every_tick(clock: ManualClock) -> None:
    ChannelFactory(key="in_app", provider_key="in_app")
    sms = ChannelFactory(key="sms", provider_key="stub", is_enabled=False)
    _due(clock, sms, 3)
    before = _skipped("sms")
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        with capture_logs() as first:
            for _ in range(4):
                assert worker.tick().error == ""
        # Enabled, but broken: another state, logged once again.
        ChannelConfig.objects.filter(pk=sms.pk).update(is_enabled=True, provider_key="carrier_pigeon")
        with capture_logs() as broken:
            for _ in range(3):
                worker.tick()
        # Fixed (its rows go out), then disabled again: news again.
        ChannelConfig.objects.filter(pk=sms.pk).update(provider_key="stub", options={"fail": "retriable"})
        worker.tick()
        ChannelConfig.objects.filter(pk=sms.pk).update(is_enabled=False)
        clock.advance(7200)  # the retried rows are due again
        with capture_logs() as again:
            worker.tick()
            worker.tick()
    finally:
        worker.close()
    [disabled] = _events(first, "channel-disabled")
    assert disabled["channel"] == "sms" and disabled["reason"] == "disabled" and disabled["due_waiting"] == 3
    assert disabled["lane"] == "default" and disabled["job_run_id"]
    [misconfigured] = _events(broken, "channel-disabled")
    assert misconfigured["reason"].startswith("misconfigured: unknown provider key 'carrier_pigeon'")
    assert [e["reason"] for e in _events(again, "channel-disabled")] == ["disabled"]
    # The metric still counts every skipped tick's rows: 4 + 3 ticks of 3 rows, then 2 more.
    assert _skipped("sms") - before == 3 * 7 + 3 * 2


def _refuse_sent(pk: Any) -> None:
    """A trigger of the test's own that refuses to mark one row Sent (what a bad migration could add)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION test_refuse_sent() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'sent' AND NEW.id = '%s' THEN
                    RAISE EXCEPTION 'this row may not be sent' USING ERRCODE = 'check_violation';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_sent BEFORE UPDATE ON notifications_retry_notificationentity
            FOR EACH ROW EXECUTE FUNCTION test_refuse_sent();
            """.replace("'%s'", f"'{pk}'")
        )


def test_claim_and_finalize_fallbacks_are_events_with_counts_run_id_and_lane(clock: ManualClock) -> None:
    channel = ChannelFactory(key="in_app", provider_key="in_app")
    rows = _due(clock, channel, 4)
    _refuse_sent(rows[0].pk)
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        with capture_logs() as logs:
            stats = worker.tick()
    finally:
        worker.close()
    assert stats.error == "" and stats.sent == 3
    [started] = _events(logs, "retry-cycle-started")
    run_id = started["job_run_id"]
    # Writing the outcomes inside the claim failed: the claim leased the rows instead.
    [claim] = _events(logs, "claim-fallback")
    assert (
        claim["fallback"] == "leases"
        and claim["outcomes"] == 4
        and "this row may not be sent" in claim["error"]
    )
    # Their bulk finalize failed on the same row: one by one, and that row alone failed.
    [bulk] = _events(logs, "finalize-fallback")
    assert bulk["outcomes"] == 4 and "this row may not be sent" in bulk["error"]
    [failed] = _events(logs, "finalize-failed")
    assert failed["notification_id"] == str(rows[0].pk)
    for event in (claim, bulk, failed):
        assert event["job_run_id"] == run_id and event["lane"] == "default"
        assert event["log_level"] in ("warning", "error")


def test_a_claim_isolating_its_rows_says_how_many(clock: ManualClock) -> None:
    channel = ChannelFactory(key="in_app", provider_key="in_app")
    _due(clock, channel, 3)
    poison = NotificationFactory(channel=channel, status=Status.PENDING)
    # A Sent row with a lease that ran out (an INSERT can write one): the claim's UPDATE fails on it.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM notifications_retry_notificationentity WHERE id = %s", [poison.pk])
        cursor.execute(
            """
            INSERT INTO notifications_retry_notificationentity (
                id, tenant_id, recipient, payload, notification_type, priority, status, attempts,
                last_error, error_kind, attempt_log, dead_letter_reason, resolution, requeue_count,
                correlation_id, created_at, updated_at, channel_id, claim_token, claim_expires_at)
            VALUES (%s, NULL, 'r', '{}', '', 5, 'sent', 1, '', '', '[]', '', '', 0, '', %s, %s, %s,
                    gen_random_uuid(), %s)
            """,
            [poison.pk, clock.now(), clock.now(), channel.pk, clock.now() - timedelta(seconds=30)],
        )
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        with capture_logs() as logs:
            stats = worker.tick()
    finally:
        worker.close()
    assert stats.sent == 3 and stats.poisoned == 1
    fallbacks = _events(logs, "claim-fallback")
    assert fallbacks and fallbacks[0]["fallback"] in ("row-by-row", "leases")
    isolate = [e for e in fallbacks if e["fallback"] == "row-by-row"]
    assert (
        isolate and isolate[0]["rows"] == 4 and isolate[0]["lane"] == "default" and isolate[0]["job_run_id"]
    )


def test_the_stop_budget_is_logged_at_the_first_tick_and_when_a_timeout_changes_it(
    clock: ManualClock,
) -> None:
    # What a process manager must wait before it kills (terminationGracePeriodSeconds): the largest
    # timeout of the channels loaded + 0.5 s + 2 s, said once, and again only when it changes.
    hook = ChannelFactory(key="hook", provider_key="in_app", timeout_seconds=5)
    ChannelFactory(key="in_app", provider_key="in_app", timeout_seconds=2)
    worker = Worker(clock=clock, rng=random.Random(1))
    try:
        with capture_logs() as logs:
            worker.tick()
            worker.tick()
            ChannelConfig.objects.filter(pk=hook.pk).update(timeout_seconds=30)
            worker.tick()
    finally:
        worker.close()
    budgets = _events(logs, "stop-budget")
    assert [(e["stop_budget_s"], e["max_timeout_s"]) for e in budgets] == [(7.5, 5.0), (32.5, 30.0)]
    assert budgets[0]["formula"] == "max(timeout_seconds) + 0.5 s + 2 s"
