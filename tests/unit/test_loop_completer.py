"""The loop's completer: the completer's rule as a task of the send loop, reports delivered outside the
loop's steps, and what the loop cannot commit handed to Django's connection on the caller's thread."""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
import structlog
from structlog.testing import capture_logs

from notifications_retry.delivery import CommitUnavailable, FinalizeReport, NeedsDjango
from notifications_retry.engine.completer import Completer, LoopCompleter
from notifications_retry.rules.outcomes import Outcome
from notifications_retry.runtime.asyncio_bridge import SteppedLoop
from notifications_retry.runtime.clock import ManualClock
from tests.unit.test_completer import outcome


class Database:
    """Two commit functions: the loop's (asynchronous) and Django's; the loop's can be down, refuse
    every batch (``refuse``) or only the next few (``refuse_next``, one error a batch)."""

    def __init__(self) -> None:
        self.up = True
        self.refuse: BaseException | None = None
        self.refuse_next: list[BaseException] = []
        self.on_loop: list[list[Outcome]] = []
        self.on_django: list[list[Outcome]] = []
        self.committed_on: list[str] = []  # "loop" / "django", in the order the commits happened
        self.loop_running: list[bool] = []
        self.hold: asyncio.Event | None = None

    async def loop_commit(self, batch: list[Outcome], now: object) -> FinalizeReport:
        self.loop_running.append(asyncio.get_running_loop().is_running())
        if self.hold is not None:
            await self.hold.wait()
        if self.refuse_next:
            raise self.refuse_next.pop(0)
        if self.refuse is not None:
            raise self.refuse
        if not self.up:
            raise CommitUnavailable("connection refused", batch)
        self.on_loop.append(list(batch))
        self.committed_on.append("loop")
        return FinalizeReport(applied=list(batch))

    def django_commit(self, batch: list[Outcome], now: object) -> FinalizeReport:
        self.on_django.append(list(batch))
        self.committed_on.append("django")
        return FinalizeReport(applied=list(batch))


#: What the tests made, closed after each (the autouse fixture below).
MADE: list[tuple[LoopCompleter, SteppedLoop]] = []


def make(db: Database, reports: list, *, max_delay: float = 0.01, max_batch: int = 100):
    loop = SteppedLoop()
    inner = Completer(
        clock=ManualClock(),
        monotonic=time.monotonic,
        on_report=reports.append,
        max_batch=max_batch,
        max_delay=max_delay,
        commit=db.django_commit,
    )
    commits = LoopCompleter(inner, loop, commit=db.loop_commit)
    MADE.append((commits, loop))
    return commits, loop


@pytest.fixture(autouse=True)
def close_what_was_made():
    yield
    while MADE:
        commits, loop = MADE.pop()
        commits.close()
        loop.close()


def wait_until(commits: LoopCompleter, predicate, timeout: float = 5.0) -> None:
    """Let the loop run (through the completer's wait) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        commits.wait(0.05)


def drain(commits: LoopCompleter, timeout: float = 5.0) -> None:
    """What the worker does at a tick's end: commit everything in hand."""
    deadline = time.monotonic() + timeout
    while commits.pending:
        assert time.monotonic() < deadline, "timed out"
        if commits.due(flush=True):
            commits.commit(None)
        commits.wait(0.05)
    commits.deliver()


@pytest.fixture
def db() -> Database:
    return Database()


def test_commits_are_tasks_of_the_loop_and_reports_are_made_outside_it(db):
    reports: list[FinalizeReport] = []
    commits, _ = make(db, reports)
    commits.add([outcome(ManualClock()), outcome(ManualClock())])
    assert reports == [] and db.on_loop == [], "nothing runs until the loop does"
    drain(commits)
    assert [len(b) for b in db.on_loop] == [2] and db.loop_running == [True]
    assert [len(r.applied) for r in reports] == [2] and db.on_django == []
    assert not commits.due(), "the caller commits only what the loop left to Django"


def test_an_outcome_waits_for_batch_mates_but_a_flush_does_not(db):
    reports: list[FinalizeReport] = []
    commits, loop = make(db, reports, max_delay=3600)
    commits.add([outcome(ManualClock())])
    loop.pause(0.05)
    assert commits.pending == 1 and db.on_loop == [], "held for batch-mates within the delay"
    commits.due(flush=True)
    loop.pause(0.01)
    assert [len(b) for b in db.on_loop] == [1]


def test_a_full_batch_is_committed_at_once(db):
    commits, loop = make(db, [], max_delay=3600, max_batch=3)
    commits.add([outcome(ManualClock()) for _ in range(4)])
    loop.pause(0.01)
    assert [len(b) for b in db.on_loop] == [3] and commits.pending == 1


def test_outcomes_outlive_an_outage_and_are_committed_when_it_ends(db):
    commits, _ = make(db, [])
    db.up = False
    commits.add([outcome(ManualClock()), outcome(ManualClock())])
    wait_until(commits, lambda: commits.unavailable)
    assert commits.pending == 2 and db.on_loop == []
    db.up = True
    drain(commits)
    assert [len(b) for b in db.on_loop] == [2] and not commits.unavailable


@pytest.mark.parametrize(
    "refusal",
    [NeedsDjango("a health change"), psycopg.errors.SerializationFailure("could not serialize")],
    ids=["needs-django", "failed-on-the-loop"],
)
def test_what_the_loop_cannot_commit_is_committed_on_djangos_connection_by_the_caller(db, refusal):
    reports: list[FinalizeReport] = []
    commits, _ = make(db, reports)
    db.refuse = refusal
    commits.add([outcome(ManualClock()), outcome(ManualClock())])
    with capture_logs() as logs:
        wait_until(commits, commits.due)
    assert commits.pending == 2 and commits.wait_hint() == 0.0
    thread = threading.current_thread().name
    commits.commit(None)
    assert [len(b) for b in db.on_django] == [2] and db.on_loop == [] and commits.pending == 0
    assert [len(r.applied) for r in reports] == [2] and threading.current_thread().name == thread
    fallbacks = [e for e in logs if e["event"] == "commit-fallback"]
    assert len(fallbacks) == (1 if isinstance(refusal, psycopg.Error) else 0)


def test_no_commit_runs_on_the_loop_while_a_batch_waits_for_djangos_connection(db):
    # The worker's thread does not run the loop while it commits on Django's connection: a loop commit
    # begun meanwhile could sit mid-transaction on the rows that commit waits for (the health bucket).
    commits, loop = make(db, [], max_batch=2)
    db.refuse_next = [NeedsDjango("a health change")]
    commits.add([outcome(ManualClock()) for _ in range(4)])
    wait_until(commits, commits.due)
    loop.pause(0.05)
    commits.due(flush=True)
    loop.pause(0.05)
    assert db.committed_on == [] and commits.pending == 4, "the second batch waits for the first"
    commits.commit(None)
    drain(commits)
    assert db.committed_on == ["django", "loop"] and commits.pending == 0


def test_what_breaks_the_task_is_raised_on_the_callers_thread(db):
    commits, _ = make(db, [])
    db.refuse = RuntimeError("bug in a commit")
    commits.add([outcome(ManualClock())])
    with pytest.raises(RuntimeError, match="bug in a commit"):
        for _ in range(100):
            commits.wait(0.05)
    commits.deliver()  # raised once


def test_wait_returns_when_a_commit_ends(db):
    reports: list[FinalizeReport] = []
    commits, _ = make(db, reports, max_delay=0.0)
    commits.add([outcome(ManualClock())])
    started = time.monotonic()
    while not reports:
        commits.wait(1.0)
        assert time.monotonic() - started < 1.0, "woken by the commit, not by the timeout"
    assert [len(r.applied) for r in reports] == [1] and commits.pending == 0


def test_a_commit_cut_off_by_the_loops_close_is_kept_for_the_caller(db):
    commits, loop = make(db, [], max_delay=0.0)
    db.hold = asyncio.Event()
    commits.add([outcome(ManualClock())])
    loop.pause(0.01)
    assert commits.pending == 1 and db.on_loop == []
    loop.close()  # cancels the commit under way
    assert commits.pending == 1, "the batch is waiting again, first in line"
    db.hold = None
    drain(commits)
    assert [len(b) for b in db.on_loop] == [1]


def test_a_stopping_worker_drops_what_its_lease_no_longer_covers_even_for_django(db):
    commits, _ = make(db, [])
    db.refuse = NeedsDjango("a suppression")
    clock = commits._completer.clock
    commits.add([outcome(clock, lease_seconds=1)])
    wait_until(commits, commits.due)
    clock.advance(2)
    with capture_logs() as logs:
        commits.drop_expired(structlog.get_logger("test"))
    assert commits.pending == 0 and not commits.due()
    assert [e["event"] for e in logs] == ["item-stale"]


def test_wait_runs_the_loop_while_outcomes_wait_and_sleeps_otherwise(db):
    # The dispatcher waits through the completer when queued records cannot start yet (a rate slot):
    # a commit in hand goes on meanwhile, and with nothing in hand the wait is the caller's sleep.
    reports: list[FinalizeReport] = []
    commits, _ = make(db, reports, max_delay=0.0)
    slept: list[float] = []
    commits.wait(0.02, slept.append)
    assert slept == [0.02] and db.on_loop == []
    commits.add([outcome(ManualClock())])
    while not reports:
        commits.wait(1.0, slept.append)
    assert slept == [0.02], "a commit in hand ran on the loop instead of a sleep"
    assert [len(b) for b in db.on_loop] == [1]
