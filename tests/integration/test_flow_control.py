"""Flow control against a real HTTP server on 127.0.0.1: rate limit, 429 Retry-After, circuit breaker, and
a queued record its lease can no longer cover (given back unsent)."""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.arrivals import max_in_window
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status


@pytest.fixture
def make_worker(clock):
    workers: list[Worker] = []

    def make(**kwargs):
        kwargs.setdefault("batch_size", 1000)
        workers.append(Worker(clock=clock, rng=random.Random(3), **kwargs))
        return workers[-1]

    yield make
    for worker in workers:
        worker.close()  # the lock's own connection would keep the test database open


def due(clock, channel, count, **kwargs):
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=60 - i * 0.001),
            **kwargs,
        )
        for i in range(count)
    ]


def circuit_events(logs):
    return [e["event"] for e in logs if e["event"].startswith("circuit-")]


def circuit_gauge(channel: str) -> float | None:
    return REGISTRY.get_sample_value("notifications_retry_circuit_state", {"channel": channel})


def test_rate_limit_never_exceeded_by_over_5_percent_in_any_second(clock, webhook_server, make_worker):
    rate = 40
    channel = ChannelFactory(
        key="limited",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=8,
        rate_limit_per_second=rate,
    )
    due(clock, channel, 130)
    stats = make_worker().tick()
    assert stats.sent == 130
    arrivals = [r.received_at for r in webhook_server.requests]
    assert len(arrivals) == 130
    assert max_in_window(arrivals) <= rate * 1.05
    # Limited, not merely slow: the whole run took about 129 intervals.
    assert arrivals[-1] - arrivals[0] >= 129 / rate * 0.95


def test_429_with_retry_after_pauses_the_channel_instead_of_retrying(clock, webhook_server, make_worker):
    answers = iter([Reply(429, headers={"Retry-After": "2"})])
    webhook_server.responder = lambda request: next(answers, Reply(200, {"id": "ok"}))
    channel = ChannelFactory(
        key="hook",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=1,
        max_attempts=5,
        backoff_base_seconds=1,
        backoff_cap_seconds=1,
    )
    records = due(clock, channel, 3)
    worker = make_worker()
    with capture_logs() as logs:
        first = worker.tick()
    assert len(webhook_server.requests) == 1
    assert first.sent == 0
    assert any(e["event"] == "channel-throttled" and e["pause_s"] == 2 for e in logs)
    for record in records:
        record.refresh_from_db()
        assert record.status == Status.FAILED
        if record.attempts > 1:  # taken in this tick: Retry-After, not the 1 s backoff, sets the next attempt
            assert record.next_attempt_at >= clock.now() + timedelta(seconds=2)
    assert NotificationEntity.objects.filter(attempts=2).exists()

    # Due again by the database clock, but the channel itself is still paused: nothing is sent.
    clock.advance(3)
    second = worker.tick()
    assert len(webhook_server.requests) == 1 and second.processed == 0

    time.sleep(2.1)
    third = worker.tick()
    assert third.sent == 3
    assert len(webhook_server.requests) == 4


def test_circuit_opens_leaves_rows_untouched_probes_once_closes(clock, webhook_server, settings, make_worker):
    settings.NOTIFICATIONS_RETRY = {
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        "CIRCUIT_BREAKER": {"failure_threshold": 3, "cooldown_seconds": 1.0},
    }
    failing = {"on": True}
    webhook_server.responder = lambda request: Reply(500) if failing["on"] else Reply(200, {"id": "ok"})
    channel = ChannelFactory(
        key="flaky",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=1,
        max_attempts=10,
    )
    records = due(clock, channel, 10)
    worker = make_worker()

    with capture_logs() as logs:
        first = worker.tick()
    assert len(webhook_server.requests) == 3
    assert first.retried == 3
    assert circuit_gauge("flaky") == 2
    opened = [e for e in logs if e["event"] == "circuit-open"]
    assert len(opened) == 1 and opened[0]["channel"] == "flaky"
    tried = {r.headers["idempotency-key"] for r in webhook_server.requests}
    untouched = [r for r in records if str(r.id) not in tried]
    assert len(untouched) == 7
    for record in untouched:
        before = record.next_attempt_at
        record.refresh_from_db()
        # Not burned through their attempts: no attempt, no lease, same due time.
        assert (record.attempts, record.claim_token, record.next_attempt_at) == (1, None, before)
        assert record.due_at == before

    # During the cool-down the channel is not called at all, although its rows are due.
    assert worker.tick().processed == 0
    assert len(webhook_server.requests) == 3

    # After the cool-down: one probe; it fails, so the circuit opens again with a single call.
    time.sleep(1.05)
    with capture_logs() as logs:
        probe = worker.tick()
    assert len(webhook_server.requests) == 4 and probe.processed == 1
    assert circuit_events(logs) == ["circuit-half-open", "circuit-open"]

    # Next probe succeeds: the circuit closes and the rest of the backlog drains in the same tick.
    failing["on"] = False
    time.sleep(1.05)
    with capture_logs() as logs:
        closing = worker.tick()
    assert circuit_events(logs) == ["circuit-half-open", "circuit-closed"]
    assert circuit_gauge("flaky") == 0
    assert closing.sent == 6  # the probe and the 5 others still due (4 failed ones wait for their backoff)
    assert NotificationEntity.objects.filter(channel=channel, status=Status.SENT).count() == 6


def test_circuit_of_one_channel_does_not_stop_another(clock, webhook_server, settings, make_worker):
    settings.NOTIFICATIONS_RETRY = {
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        "CIRCUIT_BREAKER": {"failure_threshold": 2, "cooldown_seconds": 60.0},
    }
    webhook_server.responder = lambda request: Reply(503)
    broken = ChannelFactory(
        key="broken",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=1,
        max_attempts=10,
    )
    healthy = ChannelFactory(key="in_app")
    due(clock, broken, 5)
    due(clock, healthy, 20)
    stats = make_worker().tick()
    assert len(webhook_server.requests) == 2
    assert stats.sent == 20


def test_a_record_queued_past_what_its_lease_covers_goes_back_with_its_attempt_and_is_sent_once(
    clock, webhook_server, settings, make_worker
):
    # A lease covers one round of waiting (the timeout, 0.25 s and half the grace: 3.35 s here), but two
    # rounds are queued: with one call at a time, each taking 2 s, the third row would start at 4 s.
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "LEASE_GRACE_SECONDS": 0.2}
    webhook_server.responder = lambda request: Reply(200, {"id": "ok"}, delay=2.0)
    channel = ChannelFactory(
        key="slow",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_concurrency=1,
        timeout_seconds=3.0,
    )
    records = due(clock, channel, 3)
    worker = make_worker()
    with capture_logs() as logs:
        first = worker.tick()
    released = [e for e in logs if e["event"] == "records-released"]
    assert [(e["count"], e["reason"]) for e in released] == [
        (1, "queued until their lease could no longer cover a call")
    ]
    assert first.sent == 2 and len(webhook_server.requests) == 2
    unsent = NotificationEntity.objects.get(pk__in=[r.pk for r in records], status=Status.FAILED)
    assert unsent.attempts == 1 and unsent.claim_token is None, "given back unsent, with its attempt"
    # The next tick claims it again, with a fresh lease: each row sent once, one attempt each.
    assert worker.tick().sent == 1
    assert sorted(webhook_server.keys()) == sorted(str(r.pk) for r in records)
    for record in records:
        record.refresh_from_db()
        assert (record.status, record.attempts) == (Status.SENT, 2)
