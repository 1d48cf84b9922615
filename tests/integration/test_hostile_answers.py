"""Hostile answers never hang or lose a tick: every exception inside a send is that record's outcome, an
absurd Retry-After is clamped, and a provider that ignores its own deadline is abandoned in bounded time."""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from notifications_retry.rules.backoff import MAX_DELAY_SECONDS
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db
Status = NotificationEntity.Status
PROVIDERS = {
    "deadline_ignoring": "tests.support.fault_providers.DeadlineIgnoringProvider",
    "absurd_answer": "tests.support.fault_providers.AbsurdAnswerProvider",
}


def due(clock, channel, n=3):
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=5),
        )
        for _ in range(n)
    ]


def run_tick(clock, **kwargs):
    worker = Worker(clock=clock, rng=random.Random(2), **kwargs)
    try:
        return worker.tick()
    finally:
        worker.close()


@pytest.mark.parametrize("answer", ["overflow", "recursion"])
def test_an_exception_inside_the_client_is_the_records_outcome(clock, settings, answer):
    settings.NOTIFICATIONS_RETRY = {"PROVIDERS": PROVIDERS}
    channel = ChannelFactory(
        key="odd", provider_key="absurd_answer", options={"answer": answer}, max_attempts=5
    )
    rows = due(clock, channel)
    stats = run_tick(clock)
    assert stats.retried == 3 and stats.error == ""
    for row in rows:
        row.refresh_from_db()
        assert row.status == Status.FAILED and row.error_kind == "provider_crash" and row.claim_token is None


def test_an_absurd_retry_after_is_clamped_not_raised(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"PROVIDERS": PROVIDERS}
    channel = ChannelFactory(
        key="odd", provider_key="absurd_answer", options={"answer": "huge_retry_after"}, max_attempts=5
    )
    rows = due(clock, channel, 1)
    stats = run_tick(clock)
    assert stats.retried == 1 and stats.error == ""
    rows[0].refresh_from_db()
    assert rows[0].error_kind == "throttled"
    assert rows[0].next_attempt_at - clock.now() <= timedelta(seconds=MAX_DELAY_SECONDS)


def test_a_provider_that_ignores_its_deadline_is_abandoned_in_bounded_time(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"PROVIDERS": PROVIDERS}
    channel = ChannelFactory(
        key="stuck", provider_key="deadline_ignoring", timeout_seconds=0.3, max_concurrency=2
    )
    worker = Worker(clock=clock, rng=random.Random(2), max_duration=0.2)
    try:
        # A first tick with nothing due opens the worker's connections and builds the provider: on a
        # loaded machine that alone could outlast the 0.2 s, and the timed tick would claim nothing.
        worker.tick()
        rows = due(clock, channel, 2)
        started = time.monotonic()
        stats = worker.tick()
        took = time.monotonic() - started
    finally:
        worker.close()
    # timeout + the grace after a timeout + one second, and some room for a loaded machine.
    assert took < 0.3 + 1.0 + 1.0 + 2.0, took
    assert stats.error == ""
    for row in rows:
        row.refresh_from_db()
        # Not lost: still leased, it comes back when the lease runs out.
        assert row.status == Status.FAILED and row.claim_token is not None and row.attempts == 2
