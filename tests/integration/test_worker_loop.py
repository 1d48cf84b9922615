"""What only a looping worker needs is there when it loops: the pause between its ticks (the interval,
the backoff after failed ones). A single tick (``--once``) pauses for none."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from notifications_retry.engine.reporting import TickStats
from notifications_retry.engine.worker import Worker


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
