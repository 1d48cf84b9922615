"""A worker counts the backlog (gauges, the admin's sample) and writes the lane's heartbeat at most every
``BOOKKEEPING_SECONDS``, however often its ticks end: on a large backlog the counts cost as much as a
tick of ``BATCH_SIZE`` rows."""

from __future__ import annotations

import random

import pytest

from notifications_retry.engine.reporting import BOOKKEEPING_SECONDS
from notifications_retry.engine.worker import Worker
from notifications_retry.models import BacklogSample, WorkerHeartbeat
from notifications_retry.observability import metrics
from tests.factories import ChannelFactory, due_notifications

pytestmark = pytest.mark.django_db


class Monotonic:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_ticks_within_the_window_count_once_and_the_next_window_counts_again(clock):
    channel = ChannelFactory(key="in_app")
    mono = Monotonic()
    worker = Worker(clock=clock, rng=random.Random(1), monotonic=mono, batch_size=2)
    due_notifications(clock, channel, 5)
    worker.tick()  # the first tick counts: 5 due before it, 3 after
    first = WorkerHeartbeat.objects.get(lane="default").last_tick_completed_at
    assert BacklogSample.objects.count() == 1
    assert metrics.DUE_BACKLOG._value.get() == 3

    assert BOOKKEEPING_SECONDS > 1
    clock.advance(1)
    mono.t += 1
    worker.tick()  # 2 more sent; within the window: no count, no sample, no heartbeat row
    assert BacklogSample.objects.count() == 1
    assert metrics.DUE_BACKLOG._value.get() == 3
    assert WorkerHeartbeat.objects.get(lane="default").last_tick_completed_at == first

    clock.advance(1)
    mono.t += BOOKKEEPING_SECONDS
    worker.tick()  # the window has passed: counted again
    assert BacklogSample.objects.count() == 2
    assert metrics.DUE_BACKLOG._value.get() == 0
    assert WorkerHeartbeat.objects.get(lane="default").last_tick_completed_at == clock.now()


def test_a_stopping_workers_last_tick_always_counts(clock):
    ChannelFactory(key="in_app")
    worker = Worker(clock=clock, rng=random.Random(1), monotonic=Monotonic())
    worker.tick()
    worker.stop()
    worker.tick()
    assert BacklogSample.objects.count() == 2


def test_a_tick_is_published_as_completed_after_its_backlog_is_counted(clock, monkeypatch):
    # A scraper that sees the tick completed (the metrics endpoint runs on a thread of its own) must see
    # the backlog counted after that tick, not the one before.
    channel = ChannelFactory(key="in_app")
    worker = Worker(clock=clock, rng=random.Random(1), monotonic=Monotonic(), batch_size=2)
    completed = metrics.LAST_TICK_COMPLETED.labels("default")
    seen: list[float] = []
    real_set = completed.set

    def set_completed(value: float) -> None:
        seen.append(metrics.DUE_BACKLOG._value.get())
        real_set(value)

    monkeypatch.setattr(completed, "set", set_completed)
    metrics.DUE_BACKLOG.set(-1)  # what an earlier count left
    due_notifications(clock, channel, 5)
    try:
        worker.tick()  # 2 sent, 3 still due
    finally:
        worker.close()
    assert seen == [3]


def test_the_heartbeat_is_one_upsert_that_keeps_what_it_does_not_write(clock):
    """A tick's start writes its time and keeps the last completed tick's; a new lane's row is made."""
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from notifications_retry.engine.reporting import Bookkeeping

    bookkeeping = Bookkeeping("fresh", clock, Monotonic())
    earlier = clock.now() - timedelta(minutes=1)
    with CaptureQueriesContext(connection) as first:
        bookkeeping.tick_started(earlier)
    row = WorkerHeartbeat.objects.get(lane="fresh")
    assert (row.last_tick_started_at, row.last_tick_completed_at, row.last_tick_stats) == (earlier, None, {})
    WorkerHeartbeat.objects.filter(lane="fresh").update(
        last_tick_completed_at=earlier, last_tick_stats={"sent": 3}
    )
    with CaptureQueriesContext(connection) as again:
        bookkeeping.tick_started(clock.now())
    row = WorkerHeartbeat.objects.get(lane="fresh")
    assert row.last_tick_started_at == clock.now()
    assert (row.last_tick_completed_at, row.last_tick_stats) == (earlier, {"sent": 3})
    for captured in (first, again):
        touching = [q["sql"] for q in captured.captured_queries if "workerheartbeat" in q["sql"]]
        assert len(touching) == 1 and "ON CONFLICT" in touching[0], touching


def test_the_backlog_is_counted_in_one_statement_by_the_models_own_rules(clock):
    """Each figure agrees with the query that defines it (due, lapsed, failed, unresolved dead letters),
    and all of them come back from one round trip."""
    import uuid
    from datetime import timedelta

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from notifications_retry.models import NotificationEntity

    channel = ChannelFactory(key="stub", provider_key="stub")
    now = clock.now()
    due_notifications(clock, channel, 3)
    leased = due_notifications(clock, channel, 2)
    NotificationEntity.objects.filter(pk__in=[r.pk for r in leased]).update(
        claim_token=uuid.uuid4(), claim_expires_at=now - timedelta(minutes=7)
    )
    failed = due_notifications(clock, channel, 4)
    NotificationEntity.objects.filter(pk__in=[r.pk for r in failed]).update(
        status=NotificationEntity.Status.FAILED, attempts=1, next_attempt_at=now + timedelta(hours=1)
    )
    NotificationEntity.objects.filter(pk=failed[0].pk).update(dead_lettered_at=now)
    NotificationEntity.objects.filter(pk=failed[1].pk).update(dead_lettered_at=now, resolution="discarded")
    objects = NotificationEntity.objects
    with CaptureQueriesContext(connection) as captured:
        figures = objects.backlog(now)
    assert len(captured.captured_queries) == 1
    assert figures.due == objects.due(now).count() + objects.lapsed(now).count() == 5
    assert figures.failed_backlog == objects.failed_backlog().count() == 7  # the due rows are retries too
    assert figures.dead_letters_unresolved == objects.unresolved_dead_letters().count() == 1
    # The oldest due row is a lapsed lease: due since its expiry, seven minutes ago.
    assert figures.oldest_due_age_seconds == pytest.approx(7 * 60, abs=1)
