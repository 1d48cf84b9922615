"""A disable stops calls at once, on a real PostgreSQL and a real HTTP receiver.

Once the worker has the outcome that disables a channel (a 410 Gone, the failure ratio crossed, an
operator's disable read by a commit), no further call starts on it in that tick: the calls in flight
finish, the claimed rows not called go back as they were (attempt returned, nothing logged). Run in a
test's transaction (commits on Django's connection, inline) and with real commits (the send loop's own
connection, as a running worker commits).
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from notifications_retry.engine.worker import Worker
from notifications_retry.models import (
    CHANNEL_HEALTH_TOPIC,
    ChannelConfig,
    ChannelHealthChange,
    NotificationEntity,
    Outbox,
)
from tests.conftest import allow_loopback
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import RecordedRequest, Reply

Status = NotificationEntity.Status
CONCURRENCY = 8
ROWS = 500

COMMITS = [
    pytest.param(False, marks=pytest.mark.django_db, id="inline-commits"),
    pytest.param(True, marks=pytest.mark.django_db(transaction=True), id="loop-commits"),
]


def configure(settings, **overrides):
    settings.NOTIFICATIONS_RETRY = {"BATCH_SIZE": ROWS, **overrides}
    allow_loopback(settings)


def hook(server, **fields):
    fields.setdefault("max_attempts", 5)
    return ChannelFactory(
        key="partner_hook",
        provider_key="webhook",
        options={"url": server.url},
        max_concurrency=CONCURRENCY,
        **fields,
    )


def claimable(clock, channel, count=ROWS):
    """``count`` due rows: four in five Failed (one attempt spent), the rest Pending (none yet)."""
    past = clock.now() - timedelta(seconds=5)
    return NotificationEntity.objects.bulk_create(
        NotificationFactory.build(channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=past)
        if i % 5
        else NotificationFactory.build(channel=channel, status=Status.PENDING, attempts=0, scheduled_at=past)
        for i in range(count)
    )


def tick(clock):
    worker = Worker(batch_size=ROWS, clock=clock, rng=random.Random(5))
    try:
        return worker.tick()
    finally:
        worker.close()


def called_and_untouched(rows):
    """The rows a call reached, and those left exactly as they were (attempt returned, no log entry)."""
    called, untouched = [], []
    before = {row.pk: (row.status, row.attempts) for row in rows}
    for row in NotificationEntity.objects.filter(pk__in=before):
        if row.attempt_log:
            called.append(row)
        else:
            assert (row.status, row.attempts) == before[row.pk], "an uncalled row kept its attempt"
            assert row.claim_token is None and row.dead_lettered_at is None and row.last_error == ""
            untouched.append(row)
    return called, untouched


def one_disable(channel):
    channel.refresh_from_db()
    assert not channel.is_enabled and channel.health_state == "disabled"
    (change,) = ChannelHealthChange.objects.filter(channel=channel)
    assert change.state == "disabled"
    assert Outbox.objects.filter(topic=CHANNEL_HEALTH_TOPIC).count() == 1, "one channel-health event"
    return change


@pytest.mark.parametrize("real_commits", COMMITS)
def test_a_410_with_a_full_claim_gets_at_most_the_channels_concurrency_in_calls(
    real_commits, clock, webhook_server, settings
):
    configure(settings)  # the default circuit breaker: a 410 is permanent, it never opens it
    webhook_server.responder = lambda request: Reply(410, "gone", delay=0.05)
    channel = hook(webhook_server)
    rows = claimable(clock, channel)
    stats = tick(clock)
    calls = len(webhook_server.requests)
    print(f"410 Gone: {calls} calls, {stats.claims} rows claimed")
    assert 1 <= calls <= CONCURRENCY, f"{calls} calls to an endpoint that answered 410 Gone"
    called, untouched = called_and_untouched(rows)
    assert len(called) == calls and all(row.dead_lettered_at for row in called), "each 410 is final"
    assert len(untouched) == ROWS - calls
    assert stats.claims > calls, "the tick had claimed more rows than it called"
    one_disable(channel)
    # They wait untouched, as a disabled channel's rows always do: the next tick calls nothing.
    tick(clock)
    assert len(webhook_server.requests) == calls


@pytest.mark.parametrize("real_commits", COMMITS)
def test_the_failure_ratio_crossed_stops_the_calls_at_the_commit_that_found_it(
    real_commits, clock, webhook_server, settings
):
    configure(
        settings,
        ENDPOINT_HEALTH={"min_attempts": 20, "disable_ratio": 0.95},
        CIRCUIT_BREAKER={"failure_threshold": 10_000},  # only the health check can stop the calls
    )
    webhook_server.responder = lambda request: Reply(500, "down", delay=0.1)
    channel = hook(webhook_server)
    rows = claimable(clock, channel)
    tick(clock)
    calls = len(webhook_server.requests)
    change = one_disable(channel)
    assert "disable_ratio" in change.reason and change.attempts >= 20
    # The disabling commit counted change.attempts calls; after it, only calls already in flight or
    # finished and not yet committed (each slot's, at most a few rounds' worth) reach the endpoint.
    after = calls - change.attempts
    print(f"failure ratio: {change.attempts} calls judged, {after} more after the disable")
    assert 0 <= after <= 3 * CONCURRENCY, f"{after} calls after the disable (of {calls})"
    called, untouched = called_and_untouched(rows)
    assert len(called) == calls and len(untouched) == ROWS - calls
    assert all(row.status == Status.FAILED and row.next_attempt_at > clock.now() for row in called)


@pytest.mark.django_db(transaction=True)
def test_an_operators_disable_seen_by_a_commit_stops_the_calls_mid_tick(clock, webhook_server, settings):
    configure(settings)
    channel = hook(webhook_server)
    rows = claimable(clock, channel)
    seen_at: list[int] = []
    lock = threading.Lock()

    def answer(request: RecordedRequest) -> Reply:
        with lock:
            if len(webhook_server.requests) == 40 and not seen_at:
                # The operator's disable (the admin's action), committed while the tick sends.
                ChannelConfig.objects.filter(pk=channel.pk).update(is_enabled=False)
                connection.close()  # this request thread's own connection
                seen_at.append(len(webhook_server.requests))
        return Reply(200, {"id": "m"}, delay=0.1)

    webhook_server.responder = answer
    started = time.monotonic()
    tick(clock)
    calls = len(webhook_server.requests)
    assert seen_at, "the disable was made mid-tick"
    after = calls - seen_at[0]
    print(f"operator's disable after {seen_at[0]} calls, {after} more after it")
    # Calls in flight at the disable and those started before the next commit of the channel's
    # outcomes read it: a few rounds of the channel's slots, never the rest of the claim.
    assert after <= 3 * CONCURRENCY, f"{after} calls after the operator's disable (of {calls})"
    called, untouched = called_and_untouched(rows)
    assert len(called) == calls and all(row.status == Status.SENT for row in called)
    assert len(untouched) == ROWS - calls
    assert time.monotonic() - started < 30
