"""The commit thread: the completer's rule on a thread of its own, reports delivered on the caller's."""

from __future__ import annotations

import threading
import time

import pytest
import structlog

from notifications_retry.clock import ManualClock
from notifications_retry.delivery import CommitUnavailable, FinalizeReport
from notifications_retry.engine.completer import Completer, ThreadedCompleter
from notifications_retry.outcomes import Outcome
from tests.unit.test_completer import outcome

LOG = structlog.get_logger("test")


class Database:
    """A commit function that records the thread it ran on; down while ``up`` is cleared."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        self.batches: list[list[Outcome]] = []
        self.threads: set[str] = set()
        self.fail_with: BaseException | None = None

    def __call__(self, batch: list[Outcome], now: object) -> FinalizeReport:
        self.threads.add(threading.current_thread().name)
        if self.fail_with is not None:
            raise self.fail_with
        if not self.up.is_set():
            raise CommitUnavailable("connection refused", batch)
        self.batches.append(list(batch))
        return FinalizeReport(applied=list(batch))


def make(db: Database, reports: list[FinalizeReport], *, max_delay: float = 0.01, max_batch: int = 100):
    inner = Completer(
        clock=ManualClock(),
        monotonic=time.monotonic,
        on_report=reports.append,
        max_batch=max_batch,
        max_delay=max_delay,
        commit=db,
    )
    return ThreadedCompleter(inner)


def until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_commits_run_on_their_own_thread_and_reports_on_the_callers():
    db, reports = Database(), []
    commits = make(db, reports)
    clock = ManualClock()
    try:
        commits.add([outcome(clock), outcome(clock)])
        until(lambda: commits.pending == 0)
        assert db.threads == {"notifications-retry-completer"}
        assert reports == [], "reports wait for the worker's thread"
        commits.deliver()
        assert [len(r.applied) for r in reports] == [2]
        assert not commits.due(), "the caller never commits itself"
    finally:
        commits.close()


def test_a_flush_does_not_wait_for_the_delay():
    db, reports = Database(), []
    commits = make(db, reports, max_delay=3600)
    clock = ManualClock()
    try:
        commits.add([outcome(clock)])
        time.sleep(0.05)
        assert commits.pending == 1 and db.batches == [], "held for batch-mates within the delay"
        commits.due(flush=True)
        until(lambda: commits.pending == 0)
        assert len(db.batches) == 1
    finally:
        commits.close()


def test_a_full_batch_is_committed_at_once():
    db, reports = Database(), []
    commits = make(db, reports, max_delay=3600, max_batch=3)
    clock = ManualClock()
    try:
        commits.add([outcome(clock) for _ in range(4)])
        until(lambda: len(db.batches) == 1)
        assert len(db.batches[0]) == 3 and commits.pending == 1
    finally:
        commits.close()


def test_outcomes_outlive_an_outage_and_are_committed_when_it_ends():
    db, reports = Database(), []
    commits = make(db, reports)
    clock = ManualClock()
    db.up.clear()
    try:
        commits.add([outcome(clock), outcome(clock)])
        until(lambda: commits.unavailable)
        assert commits.pending == 2 and db.batches == []
        db.up.set()
        until(lambda: commits.pending == 0)
        assert [len(b) for b in db.batches] == [2] and not commits.unavailable
    finally:
        commits.close()


def test_what_breaks_the_thread_is_raised_on_the_callers():
    db, reports = Database(), []
    commits = make(db, reports)
    db.fail_with = RuntimeError("bug in a commit")
    try:
        commits.add([outcome(ManualClock())])
        until(lambda: commits.pending == 0)
        with pytest.raises(RuntimeError, match="bug in a commit"):
            commits.deliver()
        commits.deliver()  # raised once
    finally:
        commits.close()


def test_wait_returns_when_a_commit_ends():
    db, reports = Database(), []
    commits = make(db, reports, max_delay=0.0)
    try:
        commits.add([outcome(ManualClock())])
        started = time.monotonic()
        while not reports:
            commits.wait(1.0)
            assert time.monotonic() - started < 1.0, "woken by the commit, not by the timeout"
        assert [len(r.applied) for r in reports] == [1] and commits.pending == 0
    finally:
        commits.close()


def test_closed_it_starts_again_with_the_next_outcome():
    db, reports = Database(), []
    commits = make(db, reports)
    clock = ManualClock()
    commits.add([outcome(clock)])
    until(lambda: commits.pending == 0)
    commits.close()
    assert not [t for t in threading.enumerate() if t.name == "notifications-retry-completer"]
    try:
        commits.add([outcome(clock)])
        until(lambda: commits.pending == 0)
        assert len(db.batches) == 2
    finally:
        commits.close()


def test_an_idle_thread_ends_and_the_next_outcome_starts_another(monkeypatch):
    from notifications_retry.engine import completer as commit_thread

    monkeypatch.setattr(commit_thread, "IDLE_EXIT_SECONDS", 0.05)
    monkeypatch.setattr(commit_thread, "IDLE_WAKE_SECONDS", 0.01)
    db, reports = Database(), []
    commits = make(db, reports)
    clock = ManualClock()
    try:
        commits.add([outcome(clock)])
        until(lambda: commits.pending == 0)
        until(lambda: not [t for t in threading.enumerate() if t.name == "notifications-retry-completer"])
        commits.add([outcome(clock)])
        until(lambda: len(db.batches) == 2)
    finally:
        commits.close()
