"""A tick's scheduling rules, run by the real dispatcher on a fake clock and a fake database port.

Capacity (a batch's size, a channel's chunk), the rate limiter, the circuit breaker, the end of
claiming (a stop, the deadline, a lost lock) and the wake-up after a tick: each test drives
:class:`~notifications_retry.engine.dispatcher.Dispatcher.run` with inline providers, so every send runs
on the test's own thread, the claims and releases go to :class:`FakeDatabase` (an
:class:`~notifications_retry.engine.ports.TickDatabase`) and the commits to its ``commit``. Time moves
only when a provider call or the dispatcher's own pause moves it: no thread, no sleep.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import random
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from notifications_retry.clock import ManualClock
from notifications_retry.conf import get_settings
from notifications_retry.delivery import ChannelClaim, ClaimBatch, FinalizeReport
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.completer import Completer
from notifications_retry.engine.dispatcher import Dispatcher
from notifications_retry.engine.executor import Executor
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.engine.wakeup import wake_after
from notifications_retry.exceptions import RetryableProviderError
from notifications_retry.models import ChannelConfig
from notifications_retry.outcomes import SENT, ClaimedRecord, Outcome
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult
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
        self,
        now: datetime,
        plan: Sequence[ChannelClaim],
        *,
        total: int,
        budgets: Mapping[int, tuple[int, str]],
        attempts_by_type: Mapping[str, int] | None,
        priorities: Sequence[int] | None,
        settle: Callable[[ClaimedRecord], Outcome | None] | None,
        skip: Collection[uuid.UUID],
        max_payload_bytes: int | None,
        log: Any,
        partitions: Any = None,
    ) -> ClaimBatch:
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
        max_batch=min(CONF.CLAIM_CHUNK_SIZE, batch_size),
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


# -- capacity ---------------------------------------------------------------------------------------


def test_a_tick_claims_no_more_than_its_batch_and_commits_every_row_it_claimed():
    time = FakeTime()
    db = FakeDatabase(time)
    rt = channel(time, 1)
    db.add(1, 50)
    stats = run_tick(time, db, [rt], batch_size=20)
    assert stats.claims == 20 and len(provider(rt).calls) == 20
    assert len(db.committed) == 20 and not db.leased
    assert all(total <= 20 for _, _, total in db.claims)
    assert len(db.due[1]) == 30


def test_each_claim_asks_a_channel_for_at_most_its_chunk_and_an_emptied_channel_no_more():
    time = FakeTime()
    db = FakeDatabase(time)
    busy, small = channel(time, 1), channel(time, 2)
    db.add(1, CONF.CLAIM_CHUNK_SIZE + 10)
    db.add(2, 3)
    stats = run_tick(time, db, [busy, small])
    assert all(limit <= CONF.CLAIM_CHUNK_SIZE for _, plan, _ in db.claims for limit in plan.values())
    # The small channel came back short in the first claim: it is exhausted, never asked again.
    assert sum(1 for _, plan, _ in db.claims if 2 in plan) == 1
    assert stats.sent == CONF.CLAIM_CHUNK_SIZE + 13 and not db.due[1] and not db.due[2]


# -- the rate limiter --------------------------------------------------------------------------------


def test_a_rate_limited_channel_starts_its_sends_evenly_spaced_on_the_fake_clock():
    time = FakeTime()
    db = FakeDatabase(time)
    rt = channel(time, 1, rate=10.0)
    db.add(1, 30)
    stats = run_tick(time, db, [rt])
    starts = [t for t, _ in provider(rt).calls]
    assert stats.sent == 30
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.1 - 1e-9, "no two starts closer than 1 / rate"
    assert max_in_window(starts) <= 10
    # The dispatcher waited for each slot (a fake sleep), and never far past it: about 3 s for 30.
    assert time.sleeps and starts[-1] < 3.2


def test_a_claim_of_a_rate_limited_channel_takes_only_what_it_can_start_soon():
    time = FakeTime()
    db = FakeDatabase(time)
    rt = channel(time, 1, rate=10.0)
    db.add(1, 30)
    run_tick(time, db, [rt])
    # RATE_HORIZON_SECONDS of starts a claim, not the whole chunk: a claimed row waits a short time.
    assert max(plan[1] for _, plan, _ in db.claims) <= 4
    assert len(db.claims) >= 30 // 4


# -- the circuit breaker ----------------------------------------------------------------------------


def test_failures_open_the_circuit_then_no_call_and_the_unsent_rows_go_back_unspent():
    time = FakeTime()
    db = FakeDatabase(time)
    broken, healthy = channel(time, 1, fails), channel(time, 2)
    db.add(1, 40)
    db.add(2, 10)
    stats = run_tick(time, db, [broken, healthy])
    threshold = CONF.CIRCUIT_FAILURE_THRESHOLD
    assert len(provider(broken).calls) == threshold, "not one call into an open circuit"
    assert broken.breaker.is_open
    assert stats.retried == threshold and stats.sent == 10
    # Claimed after the circuit opened or never claimed: every other row is due again, attempt unspent.
    assert not db.leased
    assert len(db.due[1]) == 40 - threshold
    assert all(r.attempts <= 1 for r in db.due[1])
    # The tick did not wait out the cool-down for them.
    assert time.t < CONF.CIRCUIT_COOLDOWN_SECONDS


def test_after_the_cooldown_one_probe_is_claimed_and_its_success_reopens_the_channel():
    time = FakeTime()
    db = FakeDatabase(time)
    answers = iter([fails] * CONF.CIRCUIT_FAILURE_THRESHOLD)
    rt = channel(time, 1, lambda m: next(answers, delivers)(m))
    db.add(1, CONF.CIRCUIT_FAILURE_THRESHOLD)
    run_tick(time, db, [rt])
    assert rt.breaker.is_open
    db.due[1].clear()
    db.add(1, 20)
    time.advance(CONF.CIRCUIT_COOLDOWN_SECONDS)
    db.claims.clear()
    stats = run_tick(time, db, [rt])
    assert db.claims[0][1] == {1: 1}, "half open: one probe, not a chunk"
    assert stats.sent == 20 and rt.breaker.state == rt.breaker.CLOSED


# -- the end of claiming: a stop, the deadline, a lost lock ------------------------------------------


@pytest.mark.parametrize("rate", [None, 100.0], ids=["inside-a-claim", "from-the-queue"])
def test_a_stop_ends_the_claims_and_every_sent_row_is_committed(rate):
    # Unlimited, an inline channel's rows are sent inside the claim itself; rate-limited, from its queue.
    time = FakeTime()
    db = FakeDatabase(time)
    sent: list[uuid.UUID] = []

    def answer(message: OutgoingMessage) -> None:
        sent.append(message.notification_id)

    rt = channel(time, 1, answer, rate=rate)
    db.add(1, 200)
    stats = run_tick(time, db, [rt], stopping=lambda: len(sent) >= 7)
    assert stats.stopped and len(sent) == 7
    assert {o.record.id for o in db.committed} == set(sent)
    assert not db.leased, "what was claimed and not sent is given back"
    assert len(db.due[1]) == 200 - 7


def test_the_deadline_ends_the_claims_and_the_tick_commits_what_it_sent():
    time = FakeTime()
    db = FakeDatabase(time)
    rt = channel(time, 1)
    provider(rt).cost = 0.5
    db.add(1, 1000)
    stats = run_tick(time, db, [rt], max_duration=10.0)
    assert stats.deadline_reached and not stats.stopped
    assert 10.0 <= time.t < 10.0 + CONF.CLAIM_CHUNK_SIZE * 0.5
    assert all(at < 10.0 for at, _, _ in db.claims), "no claim starts past the deadline"
    assert len(db.committed) == stats.claims and not db.leased


def test_a_lost_lock_starts_no_more_sends_and_gives_the_queue_back():
    time = FakeTime()
    db = FakeDatabase(time)
    rt = channel(time, 1, rate=10.0)
    db.add(1, 100)
    lock = FakeLock(time, lost_at=1.0)
    stats = run_tick(time, db, [rt], lock=lock)
    starts = [t for t, _ in provider(rt).calls]
    assert stats.lock_lost
    # The lock is asked about every LOCK_CHECK_SECONDS: no send starts later than one check after it went.
    assert starts and max(starts) < 1.0 + 0.5 + 0.1
    assert not db.leased and len(db.committed) == len(starts)


# -- the wake-up after a tick -------------------------------------------------------------------------


def test_a_tick_cut_short_wakes_on_any_due_row_and_one_that_ran_out_only_on_later_ones():
    now = datetime(2026, 1, 1, 12, 0, 30)
    started = now - timedelta(seconds=30)
    cut = TickStats(run_id="a", deadline_reached=True)
    assert wake_after(cut, batch_size=100, now=now, elapsed=30.0) is None
    full = TickStats(run_id="b", claims=100)
    assert wake_after(full, batch_size=100, now=now, elapsed=30.0) is None
    done = TickStats(run_id="c", claims=12)
    assert wake_after(done, batch_size=100, now=now, elapsed=30.0) == started
    # A skipped tick claimed nothing of its own: only later rows wake it.
    skipped = TickStats(run_id="d", claims=100, skipped=True)
    assert wake_after(skipped, batch_size=100, now=now, elapsed=30.0) == started


@pytest.mark.parametrize("rows", [0, 5])
def test_an_idle_tick_ends_at_once(rows):
    time = FakeTime()
    db = FakeDatabase(time)
    rt = channel(time, 1)
    db.add(1, rows)
    stats = run_tick(time, db, [rt])
    assert stats.sent == rows and len(db.claims) == 1 and time.t < 0.1


class _AnswersAtOnce:
    """An asynchronous channel's calls (the send loop's tasks), each delivered at once."""

    def __init__(self, time: FakeTime) -> None:
        self.clock = time.clock
        self.sent: list[uuid.UUID] = []

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.sent.append(record.id)
        return Outcome(record, SENT)


def test_a_full_cap_whose_commits_the_database_refuses_gives_its_queue_back_at_the_deadline():
    from notifications_retry.asyncio_bridge import SteppedLoop
    from notifications_retry.delivery import CommitUnavailable
    from notifications_retry.engine.in_flight import InFlightCap
    from notifications_retry.providers.webhook import WebhookProvider

    time, cap, loop = FakeTime(), InFlightCap(2), SteppedLoop()
    db = FakeDatabase(time)
    config = ChannelConfig(
        id=1, key="hooks", provider_key="webhook", max_concurrency=4, timeout_seconds=5.0,
        options={"url": "https://hooks.example.com/in"},
    )  # fmt: skip
    rt = ChannelRuntime(
        config, WebhookProvider(config.settings()), CONF, max_concurrency=4, rate_limit=None, cap=cap
    )
    db.add(1, 10)

    def down(batch: list[Outcome], now: datetime) -> FinalizeReport:
        raise CommitUnavailable("connection refused", batch)

    def sleep(seconds: float) -> None:
        assert time.t < 60, "the tick went on waiting for commits past its deadline"
        time.sleep(seconds)

    completer = Completer(
        clock=time.clock, monotonic=time.monotonic, on_report=lambda report: None, max_batch=100,
        commit=down, slots=cap,
    )  # fmt: skip
    executor = _AnswersAtOnce(time)
    dispatcher = Dispatcher(
        conf=CONF, executor=executor, completer=completer, reporter=OutcomeReporter({1: "hooks"}),  # type: ignore[arg-type]
        send_loop=lambda: loop, monotonic=time.monotonic, stopping=lambda: False, lane_priorities=None,
        db=db, sleep=sleep, cap=cap,
    )  # fmt: skip
    stats = TickStats(run_id="outage")
    dispatcher.reporter.begin_tick(stats, Log())
    rt.reset_for_tick(config)
    try:
        dispatcher.run({1: rt}, stats, batch_size=1000, deadline=1.0, lock=FakeLock(time), bound=Log())  # type: ignore[arg-type]
    finally:
        loop.close()
    assert len(executor.sent) == 2, "no call starts while its place waits for a commit"
    assert completer.pending == 2 and cap.held == {str(i) for i in executor.sent}
    assert set(db.leased) == set(executor.sent), "only the calls made wait for their commit, leased"
    assert db.released and not rt.queue, "the queue went back"


# -- a burst of starts spread on the send loop ---------------------------------------------------------


def _webhook_channel(*, max_concurrency: int = 16, rate: float | None = None, cap: Any = None) -> Any:
    from notifications_retry.providers.webhook import WebhookProvider

    config = ChannelConfig(
        id=1, key="hooks", provider_key="webhook", max_concurrency=max_concurrency, timeout_seconds=5.0,
        rate_limit_per_second=rate, options={"url": "https://hooks.example.com/in"},
    )  # fmt: skip
    provider = WebhookProvider(config.settings())
    return ChannelRuntime(config, provider, CONF, max_concurrency=max_concurrency, rate_limit=rate, cap=cap)


def test_only_a_closed_unlimited_channel_spreads_its_starts_and_by_the_calls_it_may_run():
    from notifications_retry.engine.flow_control import PACE_MARGIN
    from notifications_retry.engine.in_flight import InFlightCap

    def delays(rt: ChannelRuntime) -> list[float]:
        rt.pacer.observe(0.006)
        return [rt.start_delay(5.0) for _ in range(3)]

    assert delays(_webhook_channel())[1] == pytest.approx(0.006 / 16 / PACE_MARGIN)
    # The worker's cap of 4 runs fewer calls than the channel's 16: its starts are spaced wider.
    assert delays(_webhook_channel(cap=InFlightCap(4)))[1] == pytest.approx(0.006 / 4 / PACE_MARGIN)
    assert delays(_webhook_channel(rate=100.0)) == [0.0] * 3, "the rate limiter spaces them"
    probing = _webhook_channel()
    probing.breaker.state = probing.breaker.HALF_OPEN
    assert delays(probing) == [0.0] * 3, "a circuit's probe is never put off"


class _TimedAnswers(_AnswersAtOnce):
    """Calls delivered at once, each moving the fake clock on by ``cost``."""

    def __init__(self, time: FakeTime, cost: float) -> None:
        super().__init__(time)
        self.time, self.cost = time, cost

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.time.advance(self.cost)
        return await super().send_async(rt, record)


def _paced_tick(
    time: FakeTime, db: FakeDatabase, executor: _AnswersAtOnce, rt: ChannelRuntime, **run: Any
) -> TickStats:
    """One tick of ``rt`` on a real send loop, its starts spread (a mean call time of 12 ms)."""
    from notifications_retry.asyncio_bridge import SteppedLoop

    def sleep(seconds: float) -> None:
        assert time.t < 60, "the tick went on past every bound"
        time.sleep(seconds)

    loop = SteppedLoop()
    completer = Completer(
        clock=time.clock, monotonic=time.monotonic, on_report=lambda report: None, max_batch=100,
        commit=db.commit,
    )  # fmt: skip
    dispatcher = Dispatcher(
        conf=CONF, executor=executor, completer=completer, reporter=OutcomeReporter({1: "hooks"}),  # type: ignore[arg-type]
        send_loop=lambda: loop, monotonic=time.monotonic, lane_priorities=None, db=db, sleep=sleep,
        stopping=run.pop("stopping", lambda: False),
    )  # fmt: skip
    stats = TickStats(run_id="paced")
    dispatcher.reporter.begin_tick(stats, Log())
    rt.reset_for_tick(rt.config)
    rt.pacer.observe(0.012)
    try:
        dispatcher.run({1: rt}, stats, batch_size=1000, deadline=time.t + 45, bound=Log(), **run)
        dispatcher.finish_calls(Log(), 5.0)
        while completer.pending:
            completer.commit(Log())
    finally:
        loop.close()
    return stats


def test_a_stop_during_a_spread_burst_sends_none_of_the_starts_put_off_and_gives_them_back():
    time = FakeTime()
    db = FakeDatabase(time)
    db.add(1, 40)
    executor, rt = _AnswersAtOnce(time), _webhook_channel()
    stats = _paced_tick(time, db, executor, rt, lock=FakeLock(time), stopping=lambda: len(executor.sent) >= 1)
    assert stats.stopped and len(executor.sent) == 1, "the burst's later starts waited, then saw the stop"
    assert [o.record.id for o in db.committed] == executor.sent
    assert not db.leased and len(db.due[1]) == 39, "every start put off went back unsent"
    assert rt.inflight == 0 and not rt.queue


def test_a_lock_lost_during_a_spread_burst_gives_back_what_had_not_started_and_the_tick_ends():
    time = FakeTime()
    db = FakeDatabase(time)
    db.add(1, 40)
    executor, rt = _TimedAnswers(time, cost=1.0), _webhook_channel()
    stats = _paced_tick(time, db, executor, rt, lock=FakeLock(time, lost_at=0.5))
    assert stats.lock_lost
    assert 1 <= len(executor.sent) < 16, "starts put off past the loss never went out"
    assert sorted(o.record.id for o in db.committed) == sorted(executor.sent)
    assert not db.leased and len(db.due[1]) == 40 - len(executor.sent)
    assert rt.inflight == 0 and not rt.queue
