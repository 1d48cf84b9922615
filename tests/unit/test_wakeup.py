"""When a looping worker wakes: on a fake clock and a fake database port: no thread, no sleep."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import datetime, timedelta

import psycopg
import pytest

from notifications_retry.engine.wakeup import (
    POLL_SECONDS,
    RECONNECT_FIRST_SECONDS,
    STOP_CHECK_SECONDS,
    Waiter,
    Wake,
    reopens_at,
)
from notifications_retry.observability.heartbeat_file import BEAT_SECONDS
from notifications_retry.runtime.clock import ManualClock


@dataclasses.dataclass
class Write:
    """A write to the notification table at ``at`` (monotonic seconds): a row due ``due_in`` seconds
    after the write; ``notifies`` False for a writer whose notification never arrives."""

    at: float
    due_in: float
    notifies: bool = True


class FakeDatabase:
    """The worker's rows and the writers' notifications, on one fake clock that only waits advance.

    Faults: ``cut_at`` (monotonic) ends the session under the wait, as ``pg_terminate_backend``, a
    pooler's idle cut or a failover does; the session stays dead until the waiter resets the port.
    ``down`` (start, end) refuses every connection meanwhile, as a restarting server does.
    ``unreadable`` answers the next so many questions with a value psycopg cannot read.
    """

    def __init__(self, writes: list[Write] | None = None, *, stop_at: float | None = None) -> None:
        self.clock = ManualClock()
        self.start = self.clock.now()
        self.t = 0.0
        self.due: list[datetime] = []
        self.writes = sorted(writes or [], key=lambda w: w.at)
        self.stop_at = stop_at
        self.statements = 0
        self.cut_at: float | None = None
        self.down: tuple[float, float] | None = None
        self.unreadable = 0
        self.broken = False
        self.resets = 0
        #: When each question was tried (monotonic), answered or not.
        self.questions: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def stopping(self) -> bool:
        return self.stop_at is not None and self.t >= self.stop_at

    def _advance(self, to: float) -> None:
        self.clock.advance(to - self.t)
        self.t = to

    def sleep(self, seconds: float) -> None:
        """The waiter's pause: rows written meanwhile are stored, their notifications lost (no session)."""
        assert seconds >= 0
        until = self.t + seconds
        while self.writes and self.writes[0].at <= until:
            self._write(self.writes.pop(0))
        self._advance(until)

    def _write(self, write: Write) -> None:
        self._advance(max(self.t, write.at))
        self.due.append(self.clock.now() + timedelta(seconds=write.due_in))

    def _session(self) -> None:
        """Raise what psycopg raises on a dead session or a refused connection."""
        if self.broken:
            raise psycopg.OperationalError("the connection is closed")
        if self.down is not None and self.down[0] <= self.t < self.down[1]:
            raise psycopg.OperationalError("connection failed: Connection refused")

    # -- the port ---------------------------------------------------------------------------------

    def earliest_due(self, after: datetime | None) -> datetime | None:
        self.questions.append(self.t)
        self._session()
        if self.unreadable:
            self.unreadable -= 1
            raise psycopg.DataError("timestamp too large (after year 10K): '12000-01-01 00:00:00+00'")
        self.statements += 1
        return min((d for d in self.due if after is None or d > after), default=None)

    def notified(self, seconds: float) -> bool:
        assert seconds >= 0
        self._session()
        until = self.t + seconds
        if self.cut_at is not None and self.t <= self.cut_at < until:
            until = self.cut_at
        while self.writes and self.writes[0].at <= until:
            write = self.writes.pop(0)
            self._write(write)
            if write.notifies:
                return True
        self._advance(until)
        if until == self.cut_at:
            self.cut_at, self.broken = None, True
            raise psycopg.OperationalError(
                "consuming input failed: server closed the connection unexpectedly"
            )
        return False

    def reset(self) -> None:
        self.resets += 1
        self.broken = False


class Log:
    """A structlog logger that keeps the events it was given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def _keep(self, event: str, **fields: object) -> None:
        self.events.append((event, fields))

    info = warning = error = _keep

    def named(self, event: str) -> list[dict[str, object]]:
        return [fields for name, fields in self.events if name == event]


def waiter(db: FakeDatabase, log: Log | None = None) -> Waiter:
    return Waiter(
        db, clock=db.clock, monotonic=db.monotonic, stopping=db.stopping, sleep=db.sleep, log=log or Log()
    )


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


def test_a_cut_session_is_dropped_and_the_wait_goes_on_to_the_next_due_row():
    # The session is cut at 1 s; a row due at 6 s is written at 1.5 s, its notification lost with it.
    db = FakeDatabase([Write(at=1.5, due_in=4.5, notifies=True)])
    db.cut_at = 1.0
    log = Log()
    assert waiter(db, log).wait(until=60.0) is Wake.DUE
    assert db.t == pytest.approx(6.0), "woken when the row fell due, not at the interval's end"
    assert db.resets == 1
    (failed,) = log.named("wakeup-wait-failed")
    assert "server closed the connection" in str(failed["error"]) and failed["failures"] == 1
    (recovered,) = log.named("wakeup-wait-recovered")
    assert recovered["failures"] == 1 and recovered["after_s"] == pytest.approx(RECONNECT_FIRST_SECONDS)


def test_a_restarting_server_is_asked_again_after_a_pause_doubling_up_to_the_poll():
    db = FakeDatabase()
    db.due.append(db.start + timedelta(seconds=30))
    db.cut_at, db.down = 1.0, (1.0, 12.0)
    log = Log()
    wait = waiter(db, log)
    assert wait.wait(until=60.0) is Wake.DUE
    assert db.t == pytest.approx(30.0)
    tries = [at for at in db.questions if 1.0 < at <= 12.0 + POLL_SECONDS]
    gaps = [b - a for a, b in itertools.pairwise([1.0, *tries])]  # from the cut at 1 s
    assert gaps[:4] == pytest.approx([0.25, 0.5, 1.0, 2.0])
    assert all(gap <= POLL_SECONDS + 1e-9 for gap in gaps), "a database that stays away is asked every poll"
    assert tries[-1] - 12.0 <= POLL_SECONDS, "asked again within a poll of the server's return"
    assert db.resets == len(tries)  # the cut and each refused question dropped the connection
    # Said at the first failure and at 2, 4, 8... in a row, not once a poll; the return once.
    assert [f["failures"] for f in log.named("wakeup-wait-failed")] == [1, 2, 4, 8]  # 8 in 11 s
    assert len(log.named("wakeup-wait-recovered")) == 1
    assert wait.failures == 0 and wait.error is None


def test_an_answer_psycopg_cannot_read_is_asked_again_on_a_new_connection():
    db = FakeDatabase([Write(at=3.0, due_in=2.0, notifies=False)])
    db.unreadable = 2
    log = Log()
    wait = waiter(db, log)
    assert wait.wait(until=60.0) is Wake.DUE
    assert db.t == pytest.approx(5.0), "the poll went on: the row written at 3 s woke it at 5 s"
    assert db.resets == 2
    assert "timestamp too large" in str(log.named("wakeup-wait-failed")[0]["error"])


def test_the_interval_ends_the_wait_on_time_while_the_database_is_away():
    db = FakeDatabase()
    db.cut_at, db.down = 1.0, (1.0, 1000.0)
    wait = waiter(db)
    assert wait.wait(until=60.0) is Wake.INTERVAL
    assert db.t == pytest.approx(60.0), "not past the interval: the tick's own backoff takes over"
    assert isinstance(wait.error, psycopg.OperationalError)
    assert len(db.questions) <= 60.0 / POLL_SECONDS + 5


def test_a_stop_cuts_the_pause_before_a_reconnection_short():
    db = FakeDatabase(stop_at=1.1)
    db.cut_at, db.down = 1.0, (1.0, 1000.0)
    assert waiter(db).wait(until=60.0) is Wake.STOP
    assert db.t <= 1.1 + STOP_CHECK_SECONDS


def test_failures_in_a_row_are_counted_across_the_waits_of_one_pause_between_ticks():
    # wait_for_work waits in steps (here: the heartbeat file's beat); the pause keeps growing through them.
    db = FakeDatabase()
    db.cut_at, db.down = 0.5, (0.5, 1000.0)
    log = Log()
    beats: list[float] = []
    wake = waiter(db, log).wait_for_work(until=60.0, after=None, beat=lambda: beats.append(db.t))
    assert wake is Wake.INTERVAL and db.t == pytest.approx(60.0)
    assert len(beats) >= 60.0 / BEAT_SECONDS - 1
    assert [f["failures"] for f in log.named("wakeup-wait-failed")][:4] == [1, 2, 4, 8]
    tries = [at for at in db.questions if at > 0.5]
    assert min(b - a for a, b in itertools.pairwise(tries[3:])) >= POLL_SECONDS - 1e-9


def test_a_paused_channel_reopening_is_the_earliest_pause_end_still_ahead():
    assert reopens_at([0.0, 3.0, 12.0, 8.0], now=5.0) == 8.0
    assert reopens_at([0.0, 1.0], now=5.0) == float("inf")
