"""Scenarios 5-7: hung and dripping providers, 5xx on every call, a 429 storm with Retry-After."""

from __future__ import annotations

import bisect
import itertools
import random
import time
import uuid

import pytest

from notifications_retry import signals
from notifications_retry.engine.worker import Worker
from notifications_retry.exceptions import RetryableProviderError
from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from notifications_retry.providers.base import OutgoingMessage
from notifications_retry.providers.webhook import WebhookProvider
from tests.process.conftest import seed_due
from tests.process.helpers import assert_one_event_per_final_outcome, requests_by_key, webhook_channel
from tests.support.http_server import Reply, ScriptedServer

pytestmark = [pytest.mark.process]

SETTINGS = {"LEASE_GRACE_SECONDS": 0.3, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
Status = NotificationEntity.Status


def drain(worker: Worker, done, timeout: float) -> None:
    """Tick in this process (real clock, real database) until ``done()``."""
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert time.monotonic() < deadline, "the scenario did not settle"
            worker.tick()
            time.sleep(0.02)
    finally:
        worker.close()


def message() -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), None, "hook", "user@example.com", {"n": 1}, 1, 5, "")


@pytest.mark.parametrize(
    "reply",
    [Reply(200, {"id": "late"}, drip=1), Reply(hang=True), Reply(200, {"id": "x" * 200}, drip=8)],
    ids=["drip-headers", "hang", "drip-body"],
)
def test_each_webhook_attempt_ends_within_timeout_plus_1s_and_is_retriable(reply, settings):
    settings.NOTIFICATIONS_RETRY = SETTINGS  # the receiver is on loopback: allowlisted
    server = ScriptedServer(lambda request: reply).start()
    provider = WebhookProvider(
        ChannelConfig(
            key="hook",
            provider_key="webhook",
            timeout_seconds=1.5,
            max_concurrency=1,
            options={"url": server.url},
        ).settings()
    )
    try:
        started = time.monotonic()
        with pytest.raises(RetryableProviderError) as failure:
            provider.send(message())
        elapsed = time.monotonic() - started
    finally:
        provider.close()
        server.stop()
    assert failure.value.kind == "timeout"
    assert elapsed <= 1.5 + 1.0, elapsed


@pytest.mark.django_db(transaction=True)
def test_hung_provider_tick_respects_max_duration_and_counts_retriable_attempts(start_worker):
    server = ScriptedServer(
        lambda request: Reply(200, {"id": "late"}, drip=1) if len(server.requests) % 2 else Reply(hang=True)
    ).start()
    try:
        timeout, max_duration = 1.0, 2.0
        channel = webhook_channel(server.url, timeout_seconds=timeout, max_concurrency=2, max_attempts=5)
        seed_due(channel, 30)
        worker = start_worker(
            ["--once", "--batch-size", "1000", "--max-duration", str(max_duration)], SETTINGS
        )
        assert worker.wait(60) == 0, worker.output()
        first = min(r.received_at for r in server.requests)
        exited = time.monotonic()
        # The tick stops claiming at max-duration; what it holds then ends within timeout + 1 s.
        assert exited - first <= max_duration + timeout + 1.0 + 1.0, exited - first
        touched = NotificationEntity.objects.filter(attempts=2)
        assert touched.count() == len(server.requests) > 0
        assert NotificationEntity.objects.filter(attempts=1).count() == 30 - len(server.requests)
        assert set(touched.values_list("status", "error_kind")) == {(Status.FAILED, "timeout")}
        assert not touched.filter(dead_lettered_at__isnull=False).exists()
        assert not touched.filter(next_attempt_at__isnull=True).exists()
        assert Outbox.objects.count() == 0
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_5xx_on_every_call_max_attempts_calls_gaps_in_jitter_band_one_alert_and_event(settings):
    # The circuit breaker would pause the channel: this scenario is about the per-record schedule.
    settings.NOTIFICATIONS_RETRY = {
        "CIRCUIT_BREAKER": {"failure_threshold": 1000},
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    }
    server = ScriptedServer(lambda request: Reply(500, "down")).start()
    alerts: list[dict] = []

    def receiver(sender, **kwargs):
        alerts.append(kwargs)

    signals.terminal_failure.connect(receiver)
    try:
        max_attempts, base, jitter = 4, 1, 0.1
        channel = webhook_channel(
            server.url,
            retry_backoff="fixed",
            backoff_base_seconds=base,
            max_attempts=max_attempts,
            max_concurrency=5,
        )
        seed_due(channel, 10)
        drain(
            Worker(rng=random.Random(5)),
            lambda: not NotificationEntity.objects.filter(dead_lettered_at__isnull=True).exists(),
            30,
        )
    finally:
        signals.terminal_failure.disconnect(receiver)
        server.stop()
    by_key = requests_by_key(server.requests)
    assert len(by_key) == 10
    # Seeded rows have one attempt behind them: max_attempts - 1 calls are left for each.
    assert {len(calls) for calls in by_key.values()} == {max_attempts - 1}
    for calls in by_key.values():
        for a, b in itertools.pairwise(calls):
            gap = b.received_at - a.received_at
            # Never before the jitter band (a retry never comes early); after it by no more than the
            # loop's polling period and a call's latency, which a loaded machine stretches to a second.
            assert base * (1 - jitter) - 0.05 <= gap <= base * (1 + jitter) + 1.0, gap
    assert sorted(str(a["notification_id"]) for a in alerts) == sorted(by_key)
    assert Outbox.objects.filter(payload__status="Failed").count() == 10
    assert_one_event_per_final_outcome()


@pytest.mark.django_db(transaction=True)
def test_429_storm_waits_for_retry_after_then_keeps_to_the_rate_limit(settings):
    settings.NOTIFICATIONS_RETRY = {
        "CIRCUIT_BREAKER": {"failure_threshold": 1000},
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    }
    retry_after, rate, storm = 2, 5.0, 3

    def responder(request):
        first = server.requests[0].received_at
        if request.received_at - first < storm:
            return Reply(429, "slow down", headers={"Retry-After": str(retry_after)})
        return Reply(200, {"id": "ok"})

    server = ScriptedServer(responder).start()
    try:
        channel = webhook_channel(
            server.url, rate_limit_per_second=rate, max_concurrency=4, max_attempts=10, backoff_base_seconds=1
        )
        seed_due(channel, 25)
        drain(
            Worker(rng=random.Random(3)),
            lambda: not NotificationEntity.objects.exclude(status=Status.SENT).exists(),
            40,
        )
    finally:
        server.stop()
    times = [r.received_at for r in server.requests]
    throttled = [r.received_at for r in server.requests if r.received_at - times[0] < storm]
    assert throttled, "the storm answered 429"
    for t in throttled:
        early = [u for u in times if t < u < t + retry_after - 0.05]
        assert not early, f"{len(early)} request(s) within Retry-After of a 429"
    after = sorted(u for u in times if u - times[0] >= storm)
    assert len(after) >= 20
    # The limiter spaces starts exactly 1/rate apart, so at 5/s a 1-second window has no room for
    # the jitter of timing arrivals in a server that shares this process (a 20 ms shift shows a
    # sixth request); a 4-second window holds the same 5 % bound with room for it. The 1-second
    # window is asserted at 40/s, where 5 % is two requests, in the integration suite.
    window = 4.0
    for i, t in enumerate(after):
        assert bisect.bisect_left(after, t + window, lo=i) - i <= rate * window * 1.05
    # Limited, not merely slow: the post-storm sends took about one interval each.
    assert after[-1] - after[0] >= (len(after) - 1) / rate * 0.95
    assert NotificationEntity.objects.filter(status=Status.SENT).count() == 25
