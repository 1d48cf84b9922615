"""What only a looping worker needs is there when it loops: the pause between its ticks (the interval,
the backoff after failed ones) and the wait that ends it when a row falls due (engine.wakeup). A single
tick (``--once``) pauses for none and builds no wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from notifications_retry.engine.reporting import TickStats
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory


def scripted_ticks(worker: Worker, errors: list[str]) -> Callable[[], TickStats]:
    """``worker.tick`` in place: ticks ending with ``errors`` ("": a good one); the last asks for a stop."""
    left: Iterator[tuple[int, str]] = enumerate(errors, 1)

    def tick() -> TickStats:
        number, error = next(left)
        if number == len(errors):
            worker.stop()
        return TickStats(run_id=str(number), error=error)

    return tick


@pytest.mark.django_db
def test_a_loop_pauses_by_the_backoff_after_failed_ticks_and_by_the_interval_after_good_ones(monkeypatch):
    sleeps: list[float] = []
    worker = Worker(interval=60, sleep=sleeps.append, monotonic=lambda: 100.0)
    monkeypatch.setattr(worker, "tick", scripted_ticks(worker, ["down", "down", "down", "", "down", ""]))
    assert len(worker.run()) == 6
    assert sleeps == [1.0, 2.0, 4.0, 60.0, 1.0]


@pytest.mark.django_db
def test_a_single_tick_pauses_for_none(monkeypatch):
    sleeps: list[float] = []
    worker = Worker(interval=60, sleep=sleeps.append, monotonic=lambda: 100.0)
    monkeypatch.setattr(worker, "tick", scripted_ticks(worker, ["down"]))
    assert [t.error for t in worker.run(once=True)] == ["down"]
    assert sleeps == [] and worker._backoff is None


@pytest.mark.django_db(transaction=True)
def test_a_loop_waits_for_the_next_due_row_not_for_its_interval():
    channel = ChannelFactory(key="in_app", provider_key="in_app")
    worker = Worker(interval=60)
    thread = threading.Thread(target=lambda: (worker.run(), connection.close()), name="test-worker")
    thread.start()
    try:
        # Scheduled after the worker started: its first tick found nothing, so only the wait wakes it.
        row = NotificationFactory(
            channel=channel, status="pending", scheduled_at=timezone.now() + timedelta(seconds=1)
        )
        deadline = time.monotonic() + 20
        while NotificationEntity.objects.get(pk=row.pk).status != "sent":
            assert time.monotonic() < deadline, "the row was not sent within 20 s of an interval of 60"
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert "waiter" in vars(worker._parts), "the loop waited on its waiter"


@pytest.mark.django_db
def test_a_single_tick_builds_no_wait():
    worker = Worker(interval=60)
    worker.run(once=True)
    assert "waiter" not in vars(worker._parts)
