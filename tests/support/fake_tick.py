"""A tick on a fake clock and a fake database port: the real dispatcher, no thread, no sleep.

:class:`FakeDatabase` is an :class:`~notifications_retry.engine.ports.TickDatabase` (claims and
releases on due rows kept in memory) that also takes the completer's commits; :class:`FakeTime` moves
the wall and monotonic clocks together, only when a provider call or the dispatcher's own pause moves
them; :func:`run_tick` drives :meth:`~notifications_retry.engine.dispatcher.Dispatcher.run` with
inline providers (:class:`ScriptedProvider`), so every send runs on the test's own thread.
:class:`AnswersAtOnce` stands in for the executor of an asynchronous channel, whose calls are tasks
of a real send loop. Used by the scheduling rules' tests, the tenant limits' and the spread starts'.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from notifications_retry.conf import get_settings
from notifications_retry.delivery import ClaimBatch, ClaimRequest, FinalizeReport
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.completer import Completer
from notifications_retry.engine.dispatcher import Dispatcher, chunk_size
from notifications_retry.engine.executor import Executor
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.exceptions import RetryableProviderError
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult
from notifications_retry.rules.outcomes import SENT, ClaimedRecord, Outcome
from notifications_retry.runtime.clock import ManualClock
from tests.support.records import claimed_record

CONF = get_settings()


class FakeTime:
    """The wall clock and the monotonic clock, moved together and only by hand."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.t = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
        self.clock.advance(seconds)

    def sleep(self, seconds: float) -> None:
        """The dispatcher's pause while a queued record waits for its rate slot: time moves, nothing waits."""
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.advance(max(seconds, 1e-4))


class ScriptedProvider(Provider):
    """An inline provider: each call takes ``cost`` fake seconds, then ``answer`` decides its result."""

    inline = True

    def __init__(self, channel: Any, time: FakeTime, answer: Callable[[OutgoingMessage], None]) -> None:
        super().__init__(channel)
        self.time = time
        self.answer = answer
        self.cost = 0.001
        self.calls: list[tuple[float, uuid.UUID]] = []

    def send(self, message: OutgoingMessage) -> SendResult:
        self.calls.append((self.time.t, message.notification_id))
        self.time.advance(self.cost)
        self.answer(message)
        return SendResult(provider_message_id=f"scripted:{message.notification_id}")


def delivers(message: OutgoingMessage) -> None:
    return None


def fails(message: OutgoingMessage) -> None:
    raise RetryableProviderError("503 from the scripted provider", kind="server_error")


class FakeDatabase:
    """The tick's port: due rows per channel, leased by claims, given back by releases; and the commits."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.due: dict[int, list[ClaimedRecord]] = {}
        self.leased: dict[uuid.UUID, ClaimedRecord] = {}
        self.claims: list[tuple[float, dict[int, int], int]] = []
        self.released: list[uuid.UUID] = []
        self.committed: list[Outcome] = []

    def add(self, channel_id: int, count: int) -> list[ClaimedRecord]:
        rows = [
            claimed_record(channel_id=channel_id, recipient=f"r{i}@example.com", attempts=0, claim_token=None)
            for i in range(count)
        ]
        self.due.setdefault(channel_id, []).extend(rows)
        return rows

    def claim(
        self, request: ClaimRequest, *, settle: Callable[[ClaimedRecord], Outcome | None] | None, log: Any
    ) -> ClaimBatch:
        now, plan, total = request.now, request.plan, request.total
        self.claims.append((self.time.t, {p.channel_id: p.limit for p in plan}, total))
        batch = ClaimBatch(records=[], settled=[])
        for p in plan:
            rows = self.due.get(p.channel_id, [])
            take = min(p.limit, total - len(batch.records) - len(batch.settled), len(rows))
            taken, rows[:] = rows[:take], rows[take:]
            for row in taken:
                # As delivery.claim_due: the attempt counts, an inline send may settle the row inside
                # the claim (written by the claim itself, no lease), else the row is leased.
                record = dataclasses.replace(row, attempts=row.attempts + 1)
                outcome = settle(record) if settle is not None else None
                if outcome is not None:
                    batch.settled.append(outcome)
                    self.committed.append(outcome)
                    continue
                record.claim_token = uuid.uuid4()
                record.lease_expires_at = now + timedelta(seconds=p.lease_seconds)
                self.leased[record.id] = record
                batch.records.append(record)
        return batch

    def release(self, records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
        for record in records:
            if self.leased.pop(record.id, None) is not None:
                self.released.append(record.id)
                back = dataclasses.replace(record, attempts=record.attempts - 1, claim_token=None)
                self.due.setdefault(record.channel_id, []).append(back)
        return len(records)

    def commit(self, outcomes: list[Outcome], now: datetime) -> FinalizeReport:
        for outcome in outcomes:
            assert self.leased.pop(outcome.record.id, None) is not None, "committed under its claim token"
        self.committed.extend(outcomes)
        return FinalizeReport(applied=list(outcomes))


class FakeLock:
    """The cycle's lock as the dispatcher asks it: held until ``lost_at`` (fake monotonic seconds)."""

    idle_session_timeout = 90.0

    def __init__(self, time: FakeTime, lost_at: float = float("inf")) -> None:
        self.time = time
        self.lost_at = lost_at
        self.questions = 0

    def still_held(self) -> bool:
        self.questions += 1
        return self.time.t < self.lost_at


class Log:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


def channel(
    time: FakeTime,
    channel_id: int,
    answer: Callable[[OutgoingMessage], None] = delivers,
    *,
    rate: float | None = None,
) -> ChannelRuntime:
    config = ChannelConfig(
        id=channel_id,
        key=f"ch{channel_id}",
        provider_key="stub",
        max_concurrency=4,
        rate_limit_per_second=rate,
        timeout_seconds=5.0,
        options={},
    )
    provider = ScriptedProvider(config.settings(), time, answer)
    return ChannelRuntime(config, provider, CONF, max_concurrency=4, rate_limit=rate)


def no_send_loop() -> Any:
    raise AssertionError("an inline tick starts no thread")


def run_tick(
    time: FakeTime,
    db: FakeDatabase,
    runtimes: list[ChannelRuntime],
    *,
    batch_size: int = 1000,
    max_duration: float = 45.0,
    stopping: Callable[[], bool] = lambda: False,
    lock: FakeLock | None = None,
) -> TickStats:
    for rt in runtimes:
        rt.reset_for_tick(rt.config)  # as the worker's ChannelSet.load does before each tick
    by_id = {rt.config.pk: rt for rt in runtimes}
    stats = TickStats(run_id="scheduling-rules")
    reporter = OutcomeReporter({cid: rt.key for cid, rt in by_id.items()})
    reporter.begin_tick(stats, Log())
    completer = Completer(
        clock=time.clock,
        monotonic=time.monotonic,
        on_report=reporter.report,
        max_batch=chunk_size(batch_size),
        commit=db.commit,
    )
    executor = Executor(
        clock=time.clock, rng=random.Random(7), monotonic=time.monotonic, attempts_by_type={}, threads=1
    )
    dispatcher = Dispatcher(
        conf=CONF,
        executor=executor,
        completer=completer,
        reporter=reporter,
        send_loop=no_send_loop,
        monotonic=time.monotonic,
        stopping=stopping,
        lane_priorities=None,
        db=db,
        sleep=time.sleep,
    )
    dispatcher.run(
        by_id,
        stats,
        batch_size=batch_size,
        deadline=time.t + max_duration,
        lock=lock or FakeLock(time),  # type: ignore[arg-type]
        bound=Log(),
    )
    dispatcher.finish_calls(Log(), 0.0)
    while completer.pending:
        completer.commit(Log())
    return stats


def provider(rt: ChannelRuntime) -> ScriptedProvider:
    assert isinstance(rt.provider, ScriptedProvider)
    return rt.provider


def max_in_window(times: list[float], window: float = 1.0 - 1e-6) -> int:
    times = sorted(times)
    return max(bisect.bisect_left(times, t + window, lo=i) - i for i, t in enumerate(times))


class AnswersAtOnce:
    """An asynchronous channel's calls (the send loop's tasks), each delivered at once."""

    def __init__(self, time: FakeTime) -> None:
        self.clock = time.clock
        self.sent: list[uuid.UUID] = []

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.sent.append(record.id)
        return Outcome(record, SENT)


def loop_dispatcher(
    time: FakeTime,
    db: FakeDatabase,
    executor: AnswersAtOnce,
    loop: Any,
    stopping: Callable[[], bool],
    *,
    commit_delay: float | None = None,
) -> tuple[Dispatcher, Completer]:
    """The real dispatcher of channel 1 (``hooks``) on ``loop`` (a real send loop), the fake clock and
    database, and its completer (``commit_delay``: its batch delay; None, the default one)."""

    def sleep(seconds: float) -> None:
        assert time.t < 60, "the tick went on past every bound"
        time.sleep(seconds)

    delay = {} if commit_delay is None else {"max_delay": commit_delay}
    completer = Completer(
        clock=time.clock, monotonic=time.monotonic, on_report=lambda report: None, max_batch=100,
        commit=db.commit, **delay,
    )  # fmt: skip
    dispatcher = Dispatcher(
        conf=CONF, executor=executor, completer=completer, reporter=OutcomeReporter({1: "hooks"}),  # type: ignore[arg-type]
        send_loop=lambda: loop, monotonic=time.monotonic, lane_priorities=None, db=db, sleep=sleep,
        stopping=stopping,
    )  # fmt: skip
    return dispatcher, completer


def run_loop_tick(
    time: FakeTime,
    db: FakeDatabase,
    executor: AnswersAtOnce,
    rt: ChannelRuntime,
    *,
    max_duration: float = 45.0,
    lock: FakeLock | None = None,
    stopping: Callable[[], bool] = lambda: False,
    commit_delay: float | None = None,
    finish_within: float = 5.0,
) -> TickStats:
    """One tick of ``rt`` (channel 1) by :func:`loop_dispatcher` on a real send loop of its own."""
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

    loop = SteppedLoop()
    dispatcher, completer = loop_dispatcher(time, db, executor, loop, stopping, commit_delay=commit_delay)
    stats = TickStats(run_id="send-loop")
    dispatcher.reporter.begin_tick(stats, Log())
    rt.reset_for_tick(rt.config)
    try:
        deadline = time.t + max_duration
        dispatcher.run(
            {1: rt}, stats, batch_size=1000, deadline=deadline, lock=lock or FakeLock(time), bound=Log()
        )
        dispatcher.finish_calls(Log(), finish_within)
        while completer.pending:
            completer.commit(Log())
    finally:
        loop.close()
    return stats
