"""A throttle gives back what it did not call: only rows sent to the provider spend an attempt.

At ``max_concurrency`` 32 a channel has 32 calls in flight and a round of 32 more claimed behind them.
When the provider answers 429 with Retry-After, the queued rows were never sent: they are given back
with their attempt (as a circuit opening's are), due again when the pause ends.
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import Sum

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from notifications_retry.runtime.clock import ManualClock
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status
PAUSE = 30


def _seed(clock: ManualClock, channel: Any, n: int) -> list[NotificationEntity]:
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=60 - i * 0.01),
        )
        for i in range(n)
    ]


def _attempts() -> int:
    return int(NotificationEntity.objects.aggregate(total=Sum("attempts"))["total"])


def _tick(clock: ManualClock) -> None:
    worker = Worker(clock=clock, rng=random.Random(4))
    try:
        assert worker.tick().error == ""
    finally:
        worker.close()


@pytest.fixture
def throttling(settings: Any) -> Any:
    from tests.conftest import allow_loopback

    allow_loopback(settings)
    # Every call is answered 429 after a short delay, so the channel's 32 slots are all in flight.
    server = ScriptedServer(lambda r: Reply(429, headers={"Retry-After": str(PAUSE)}, delay=0.05)).start()
    yield server
    server.stop()


def test_at_max_concurrency_32_a_throttle_spends_one_attempt_per_call(
    clock: ManualClock, throttling: Any
) -> None:
    channel = ChannelFactory(
        key="hook",
        provider_key="webhook",
        options={"url": throttling.url},
        max_concurrency=32,
        max_attempts=5,
        timeout_seconds=5,
    )
    rows = _seed(clock, channel, 100)
    before = _attempts()
    _tick(clock)
    calls = len(throttling.requests)
    spent = _attempts() - before
    print(
        f"max_concurrency 32, one throttle: {calls} calls, {spent} attempts spent "
        f"({spent / calls:.2f} per call)"
    )
    assert calls >= 1 and spent == calls
    called = Counter(throttling.keys())
    for row in NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]):
        assert row.claim_token is None
        if str(row.pk) in called:
            assert (row.attempts, row.error_kind) == (2, "throttled")
        else:
            assert (row.attempts, row.error_kind) == (1, "")
        # Nothing is due again before the provider's pause ends.
        if row.next_attempt_at > clock.now() - timedelta(seconds=1):
            assert row.next_attempt_at >= clock.now() + timedelta(seconds=PAUSE)


def test_repeated_throttling_never_dead_letters_a_row_called_fewer_times_than_its_budget(
    clock: ManualClock, throttling: Any
) -> None:
    channel = ChannelFactory(
        key="hook",
        provider_key="webhook",
        options={"url": throttling.url},
        max_concurrency=32,
        max_attempts=3,
        timeout_seconds=5,
        retry_backoff="fixed",
        backoff_base_seconds=1,
    )
    rows = _seed(clock, channel, 100)
    for _ in range(6):
        _tick(clock)
        clock.advance(PAUSE + 5)
    calls = Counter(throttling.keys())
    dead = NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]).exclude(dead_lettered_at=None)
    assert dead.exists()
    for row in dead:
        # Its first attempt was counted before the test (attempts=1 when seeded): two calls remain.
        assert calls[str(row.pk)] == 2, (row.pk, calls[str(row.pk)])
    for row in NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]):
        assert row.attempts == 1 + calls[str(row.pk)]


def test_rows_claimed_as_the_circuit_opened_are_given_back_not_left_queued(clock: ManualClock) -> None:
    # A claim already running when a call's answer opened the circuit brings rows the channel can no
    # longer send this tick: they are given back with their attempt (the tick once looped on them).
    from notifications_retry.conf import get_settings
    from notifications_retry.database.locks import Ownership
    from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due
    from notifications_retry.engine.channels import ChannelRuntime
    from notifications_retry.engine.dispatcher import Dispatcher
    from notifications_retry.providers.webhook import WebhookProvider

    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": "https://hooks.example.com/in"}, max_attempts=5
    )
    rows = _seed(clock, channel, 3)
    batch = claim_due(
        ClaimRequest(
            clock.now(), [ChannelClaim(channel.pk, 3, 60.0)], total=3, budgets={channel.pk: (5, "hook")}
        )
    )
    conf = get_settings()
    rt = ChannelRuntime(
        channel, WebhookProvider(channel.settings()), conf, max_concurrency=1, rate_limit=None
    )
    for _ in range(conf.CIRCUIT_BREAKER.failure_threshold):
        rt.breaker.failure(0.0)
    assert rt.breaker.state == rt.breaker.OPEN
    rt.queue.extend(batch.records)
    dispatcher = Dispatcher(
        conf=conf,
        executor=None,  # type: ignore[arg-type]
        completer=None,  # type: ignore[arg-type]
        reporter=None,  # type: ignore[arg-type]
        send_loop=None,  # type: ignore[arg-type]
        monotonic=lambda: 1.0,
        stopping=lambda: False,
        lane_priorities=None,
    )
    dispatcher.ownership = Ownership(lambda: 1.0, idle_session_timeout=90)
    dispatcher.ownership.begin(1.0)
    dispatcher._start({channel.pk: rt})
    assert not rt.queue
    released = NotificationEntity.objects.filter(pk__in=[r.pk for r in rows])
    assert set(released.values_list("attempts", "claim_token")) == {(1, None)}
