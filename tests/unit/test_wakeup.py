"""When a looping worker wakes: on a fake clock and a fake database port: no thread, no sleep."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import psycopg
import pytest

from notifications_retry.clock import ManualClock
from notifications_retry.engine.wakeup import POLL_SECONDS, STOP_CHECK_SECONDS, Waiter, Wake, reopens_at


@dataclasses.dataclass
class Write:
    """A write to the notification table at ``at`` (monotonic seconds): a row due ``due_in`` seconds
    after the write; ``notifies`` False for a writer whose notification never arrives."""

    at: float
    due_in: float
    notifies: bool = True


class FakeDatabase:
    """The worker's rows and the writers' notifications, on one fake clock that only waits advance."""

    def __init__(self, writes: list[Write] | None = None, *, stop_at: float | None = None) -> None:
        self.clock = ManualClock()
        self.start = self.clock.now()
        self.t = 0.0
        self.due: list[datetime] = []
        self.writes = sorted(writes or [], key=lambda w: w.at)
        self.stop_at = stop_at
        self.statements = 0
        self.failing = False

    def monotonic(self) -> float:
        return self.t

    def stopping(self) -> bool:
        return self.stop_at is not None and self.t >= self.stop_at

    def _advance(self, to: float) -> None:
        self.clock.advance(to - self.t)
        self.t = to

    # -- the port ---------------------------------------------------------------------------------

    def earliest_due(self, after: datetime | None) -> datetime | None:
        if self.failing:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        self.statements += 1
        return min((d for d in self.due if after is None or d > after), default=None)

    def notified(self, seconds: float) -> bool:
        assert seconds >= 0
        until = self.t + seconds
        while self.writes and self.writes[0].at <= until:
            write = self.writes.pop(0)
            self._advance(max(self.t, write.at))
            self.due.append(self.clock.now() + timedelta(seconds=write.due_in))
            if write.notifies:
                return True
        self._advance(until)
        return False


def waiter(db: FakeDatabase) -> Waiter:
    return Waiter(db, clock=db.clock, monotonic=db.monotonic, stopping=db.stopping)


def test_it_wakes_when_the_earliest_row_falls_due():
    db = FakeDatabase()
    db.due.append(db.start + timedelta(seconds=5))
    assert waiter(db).wait(until=60.0) is Wake.DUE
    assert db.t == pytest.approx(5.0)


def test_a_row_written_due_now_wakes_it_at_once():
    db = FakeDatabase([Write(at=3.3, due_in=0)])
    assert waiter(db).wait(until=60.0) is Wake.DUE
    assert db.t == pytest.approx(3.3)


def test_a_row_written_due_later_sets_the_timer_to_its_due_time():
    db = FakeDatabase([Write(at=1.0, due_in=9.5)])
    assert waiter(db).wait(until=60.0) is Wake.DUE
    assert db.t == pytest.approx(10.5)


def test_nothing_due_costs_one_statement_a_poll_until_the_interval_ends():
    db = FakeDatabase()
    assert waiter(db).wait(until=60.0) is Wake.INTERVAL
    assert db.t == pytest.approx(60.0)
    assert db.statements == pytest.approx(60.0 / POLL_SECONDS, abs=1)


def test_a_notification_that_never_comes_is_made_up_for_by_the_poll():
    db = FakeDatabase([Write(at=0.5, due_in=0, notifies=False)])
    assert waiter(db).wait(until=60.0) is Wake.DUE
    assert 0.5 < db.t <= 0.5 + POLL_SECONDS + 1e-9


def test_rows_the_last_tick_could_not_take_do_not_wake_it_again():
    db = FakeDatabase([Write(at=7.0, due_in=0)])
    tick_started = db.clock.now()
    db.due.append(tick_started - timedelta(seconds=1))  # due, but its channel's circuit is open
    assert waiter(db).wait(until=60.0, after=tick_started) is Wake.DUE
    assert db.t == pytest.approx(7.0)  # only the row written later woke it


def test_the_interval_ends_before_a_later_row_falls_due():
    db = FakeDatabase()
    db.due.append(db.start + timedelta(seconds=90))
    assert waiter(db).wait(until=60.0) is Wake.INTERVAL
    assert db.t == pytest.approx(60.0)


def test_a_stop_ends_the_wait_within_one_slice():
    db = FakeDatabase(stop_at=12.345)
    assert waiter(db).wait(until=60.0) is Wake.STOP
    assert db.t <= 12.345 + STOP_CHECK_SECONDS


def test_a_database_that_cannot_be_asked_ends_the_wait_with_its_error():
    db = FakeDatabase()
    db.failing = True
    wait = waiter(db)
    assert wait.wait(until=60.0) is Wake.FAILED
    assert isinstance(wait.error, psycopg.OperationalError)
    assert db.t == 0.0


def test_a_paused_channel_reopening_is_the_earliest_pause_end_still_ahead():
    assert reopens_at([0.0, 3.0, 12.0, 8.0], now=5.0) == 8.0
    assert reopens_at([0.0, 1.0], now=5.0) == float("inf")
