"""A database fault spends no attempt: claimed records it kept from being called go back with theirs.

Records still queued when a database error ends their tick, and records whose give-back the database
refused, are kept (``GiveBack.keep``) and given back once it answers (``GiveBack.release_kept``), never
called by the tick that failed. Run on the fake clock and database port of ``tests.support.fake_tick``;
``tests/process/test_database_outages.py`` shows the same against PostgreSQL restarted and its
connections terminated.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError

from notifications_retry.delivery import ClaimRequest
from notifications_retry.engine.claiming import GiveBack
from notifications_retry.engine.completer import Completer
from notifications_retry.engine.dispatcher import Dispatcher
from notifications_retry.engine.executor import Executor
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.rules.outcomes import ClaimedRecord
from tests.support.fake_tick import CONF, FakeDatabase, FakeLock, FakeTime, Log, channel, provider


class FlakyDatabase(FakeDatabase):
    """The fake port, down from its ``fail_from``-th claim on (its releases too) until ``down`` is reset."""

    def __init__(self, time: FakeTime, fail_from: int = 10**9) -> None:
        super().__init__(time)
        self.fail_from = fail_from
        self.down = False

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        if len(self.claims) + 1 >= self.fail_from:
            self.down = True
        if self.down:
            raise OperationalError("server closed the connection unexpectedly")
        return super().claim(*args, **kwargs)

    def release(self, records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
        if self.down:
            raise OperationalError("connection refused")
        self.not_before = not_before
        return super().release(records, not_before=not_before)


class Events:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **fields: self.events.append((event, fields))


def test_records_queued_when_a_claim_fails_on_the_database_go_back_with_their_attempt_uncalled():
    time = FakeTime()
    db = FlakyDatabase(time, fail_from=2)
    rt = channel(time, 1, rate=20.0)  # records queue behind the rate limiter between claims
    rows = db.add(1, 200)
    rt.reset_for_tick(rt.config)
    completer = Completer(
        clock=time.clock, monotonic=time.monotonic, on_report=lambda report: None, max_batch=100,
        commit=db.commit,
    )  # fmt: skip
    executor = Executor(
        clock=time.clock, rng=random.Random(7), monotonic=time.monotonic, attempts_by_type={}, threads=1
    )
    dispatcher = Dispatcher(
        conf=CONF, executor=executor, completer=completer, reporter=OutcomeReporter({1: rt.key}),
        send_loop=lambda: None, monotonic=time.monotonic, stopping=lambda: False, lane_priorities=None,
        db=db, sleep=time.sleep,
    )  # fmt: skip
    stats = TickStats(run_id="claim-fails")
    dispatcher.reporter.begin_tick(stats, Log())
    with pytest.raises(OperationalError):
        dispatcher.run({1: rt}, stats, batch_size=1000, deadline=45.0, lock=FakeLock(time), bound=Log())  # type: ignore[arg-type]
    dispatcher.finish_calls(Log(), 0.0)  # as the worker does after a tick that failed
    while completer.pending:
        completer.commit(Log())

    called = {nid for _, nid in provider(rt).calls}
    kept = [record for item in dispatcher.give_back.kept for record in item.records]
    assert kept, "the claim that failed found records queued"
    assert not rt.queue and not rt.lapsed
    assert not called & {record.id for record in kept}, "a record kept is never called by the failed tick"
    assert set(db.leased) == {record.id for record in kept}, "every other row was called and committed"

    db.down = False  # the database is back: the worker's next tick gives them back first
    dispatcher.give_back.release_kept(Log())
    assert not dispatcher.give_back.kept and not db.leased
    assert set(db.released) == {record.id for record in kept}
    spent = {row.id: row.attempts for row in db.due[1]}
    assert all(spent[record.id] == 0 for record in kept), "their attempt came back"
    # Every row was called once and committed, or is due again uncalled (kept, or never claimed).
    assert len(db.committed) == len(called) and len(called) + len(db.due[1]) == len(rows)


def test_a_give_back_the_database_refuses_is_kept_and_made_once_it_answers():
    time = FakeTime()
    db = FlakyDatabase(time)
    db.add(1, 5)
    batch = db.claim(
        ClaimRequest(time.clock.now(), [_plan(1, 5)], total=5, budgets={}), settle=None, log=Log()
    )
    records = batch.records
    assert len(records) == 5
    events = Events()
    give_back = GiveBack(db, now=time.clock.now, monotonic=time.monotonic, log=lambda: events)
    rt = channel(time, 1)
    rt.paused_at, rt.paused_until = 0.0, 30.0  # the provider asked the channel to wait 30 s

    db.down = True
    with pytest.raises(OperationalError):
        give_back.hold_back(rt, records[:3])
    with pytest.raises(OperationalError):
        give_back.release(records[3:], "the cycle's lock was lost before they were sent")
    assert [len(item.records) for item in give_back.kept] == [3, 2]
    assert give_back.kept[0].not_before == time.clock.now() + timedelta(seconds=30)

    give_back.release_kept(events)  # still down: kept, and said so
    assert [len(item.records) for item in give_back.kept] == [3, 2]
    assert events.events[-1] == (
        "records-release-deferred",
        {"count": 5, "error": "OperationalError: connection refused"},
    )

    db.down = False
    give_back.release_kept(events)
    assert not give_back.kept and not db.leased and sorted(db.released) == sorted(r.id for r in records)
    assert db.not_before is None  # the last give-back was the plain one; the throttled one kept its pause
    released = [fields for event, fields in events.events if event == "records-released"]
    assert [fields["count"] for fields in released] == [3, 2]
    assert all(fields["after_database_error"] for fields in released)


def test_records_without_a_lease_are_not_kept():
    time = FakeTime()
    give_back = GiveBack(FlakyDatabase(time), now=time.clock.now, monotonic=time.monotonic, log=Log)
    settled = FakeDatabase(time).add(1, 2)  # never leased: no claim token
    give_back.keep(settled, "the tick ended before they were sent")
    assert give_back.kept == []


def _plan(channel_id: int, limit: int) -> Any:
    from notifications_retry.delivery import ChannelClaim

    return ChannelClaim(channel_id, limit, 10.0)
