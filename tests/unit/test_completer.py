"""The completer commits outcomes within a bounded delay and keeps them through a database outage."""

from __future__ import annotations

from datetime import timedelta

import pytest
import structlog

from notifications_retry.delivery import CommitUnavailable, FinalizeReport
from notifications_retry.engine.completer import RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS, Completer
from notifications_retry.engine.flow_control import InFlightCap
from notifications_retry.rules.outcomes import SENT, Outcome
from notifications_retry.runtime.clock import ManualClock
from tests.support.records import claimed_record


class Mono:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def outcome(clock: ManualClock, lease_seconds: float = 30) -> Outcome:
    record = claimed_record(lease_expires_at=clock.now() + timedelta(seconds=lease_seconds))
    return Outcome(record, SENT)


class Database:
    """A commit function that is up or down, recording what it was asked to commit."""

    def __init__(self) -> None:
        self.up = True
        self.batches: list[list[Outcome]] = []

    def __call__(self, batch, now):
        if not self.up:
            raise CommitUnavailable("connection refused", batch)
        self.batches.append(list(batch))
        return FinalizeReport(applied=list(batch))


def make(clock, mono, db, reports, max_batch=3, max_delay=0.025):
    return Completer(
        clock=clock,
        monotonic=mono,
        on_report=reports.append,
        max_batch=max_batch,
        max_delay=max_delay,
        commit=db,
    )


LOG = structlog.get_logger("test")


def test_an_outcome_waits_at_most_the_delay():
    clock, mono, db, reports = ManualClock(), Mono(), Database(), []
    completer = make(clock, mono, db, reports)
    completer.add([outcome(clock)])
    assert not completer.due()
    assert completer.wait_hint() == pytest.approx(0.025)
    mono.now += 0.024
    assert not completer.due()
    mono.now += 0.001
    assert completer.due()
    completer.commit(LOG)
    assert [len(b) for b in db.batches] == [1] and completer.pending == 0
    assert reports[0].applied


def test_a_full_batch_commits_without_waiting_and_the_rest_waits_its_turn():
    clock, mono, db, reports = ManualClock(), Mono(), Database(), []
    completer = make(clock, mono, db, reports, max_batch=3)
    completer.add([outcome(clock) for _ in range(5)])
    assert completer.due()
    completer.commit(LOG)
    assert [len(b) for b in db.batches] == [3] and completer.pending == 2
    assert not completer.due()  # the remainder starts a new delay
    assert completer.due(flush=True)


def test_an_outage_keeps_the_outcomes_and_retries_with_backoff():
    clock, mono, db, reports = ManualClock(), Mono(), Database(), []
    completer = make(clock, mono, db, reports)
    kept = [outcome(clock) for _ in range(2)]
    completer.add(kept)
    db.up = False
    completer.commit(LOG)
    assert completer.pending == 2 and completer.unavailable
    assert not completer.due(flush=True), "backing off"
    assert completer.wait_hint() == pytest.approx(RETRY_FIRST_SECONDS)
    mono.now += RETRY_FIRST_SECONDS
    completer.commit(LOG)  # still down: the backoff doubles, up to its cap
    assert completer.wait_hint() == pytest.approx(2 * RETRY_FIRST_SECONDS)
    for _ in range(10):
        mono.now += completer.wait_hint()
        completer.commit(LOG)
    assert completer.wait_hint() == pytest.approx(RETRY_MAX_SECONDS)
    db.up = True
    mono.now += RETRY_MAX_SECONDS
    assert completer.due(flush=True)
    completer.commit(LOG)
    assert db.batches == [kept] and completer.pending == 0 and not completer.unavailable


def test_outcomes_whose_lease_ran_out_during_an_outage_are_dropped():
    clock, mono, db, reports = ManualClock(), Mono(), Database(), []
    completer = make(clock, mono, db, reports)
    short, long = outcome(clock, lease_seconds=5), outcome(clock, lease_seconds=60)
    completer.add([short, long])
    db.up = False
    completer.commit(LOG)
    clock.advance(10)
    completer.drop_expired(LOG)
    db.up = True
    mono.now += 1
    completer.commit(LOG)
    assert db.batches == [[long]]


def make_capped(clock, mono, db, reports, cap):
    return Completer(
        clock=clock,
        monotonic=mono,
        on_report=reports.append,
        max_batch=10,
        max_delay=0.025,
        commit=db,
        slots=cap,
    )


def test_an_outcome_holding_the_caps_last_slot_is_committed_at_once_and_frees_it():
    clock, mono, db, reports, cap = ManualClock(), Mono(), Database(), [], InFlightCap(2)
    completer = make_capped(clock, mono, db, reports, cap)
    first, second = outcome(clock), outcome(clock)
    cap.hold(first.record.id_text)
    completer.add([first])
    assert cap.free and not completer.due(), "a slot is free: the outcome waits for batch-mates"
    assert completer.wait_hint() == pytest.approx(0.025)
    cap.hold(second.record.id_text)
    completer.add([second])
    assert not cap.free and completer.due() and completer.wait_hint() == 0.0
    completer.commit(LOG)
    assert db.batches == [[first, second]] and cap.free and not cap.held


def test_refused_stale_and_expired_outcomes_free_their_slots_and_an_outage_keeps_them():
    clock, mono, db, reports, cap = ManualClock(), Mono(), Database(), [], InFlightCap(4)
    completer = make_capped(clock, mono, db, reports, cap)
    kept, short = outcome(clock), outcome(clock, lease_seconds=5)
    for o in (kept, short):
        cap.hold(o.record.id_text)
    completer.add([kept, short])
    db.up = False
    completer.commit(LOG)
    assert cap.held == {kept.record.id_text, short.record.id_text}, "not written: still held"
    clock.advance(10)
    completer.drop_expired(LOG)
    assert cap.held == {kept.record.id_text}, "dropped: its slot is free"
    completer.settle(FinalizeReport(stale=[kept]), LOG)
    assert not cap.held


def test_no_cap_no_hurry():
    clock, mono, db, reports = ManualClock(), Mono(), Database(), []
    completer = make(clock, mono, db, reports)
    completer.add([outcome(clock)])
    assert not completer.due() and completer.wait_hint() == pytest.approx(0.025)
