"""A tick's scheduling rules, run by the real dispatcher on a fake clock and a fake database port.

Capacity (a batch's size, a channel's chunk), the rate limiter, the circuit breaker, the end of
claiming (a stop, the deadline, a lost lock), the wake-up after a tick, and a full cap whose commits
the database refuses: each test drives :class:`~notifications_retry.engine.dispatcher.Dispatcher.run`
through :mod:`tests.support.fake_tick`, so the claims and releases go to its ``FakeDatabase`` and
time moves only when a provider call or the dispatcher's own pause moves it: no thread, no sleep.
A burst of starts spread on the send loop is tested in ``test_spread_starts``.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime, timedelta

import pytest

from notifications_retry.delivery import FinalizeReport
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.completer import Completer
from notifications_retry.engine.dispatcher import CLAIM_CHUNK_SIZE, Dispatcher
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.engine.wakeup import wake_after
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.base import OutgoingMessage
from notifications_retry.rules.outcomes import Outcome
from tests.support.fake_tick import (
    CONF,
    AnswersAtOnce,
    FakeDatabase,
    FakeLock,
    FakeTime,
    Log,
    channel,
    delivers,
    fails,
    max_in_window,
    provider,
    run_tick,
)

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
    db.add(1, CLAIM_CHUNK_SIZE + 10)
    db.add(2, 3)
    stats = run_tick(time, db, [busy, small])
    assert all(limit <= CLAIM_CHUNK_SIZE for _, plan, _ in db.claims for limit in plan.values())
    # The small channel came back short in the first claim: it is exhausted, never asked again.
    assert sum(1 for _, plan, _ in db.claims if 2 in plan) == 1
    assert stats.sent == CLAIM_CHUNK_SIZE + 13 and not db.due[1] and not db.due[2]


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
    threshold = CONF.CIRCUIT_BREAKER.failure_threshold
    assert len(provider(broken).calls) == threshold, "not one call into an open circuit"
    assert broken.breaker.is_open
    assert stats.retried == threshold and stats.sent == 10
    # Claimed after the circuit opened or never claimed: every other row is due again, attempt unspent.
    assert not db.leased
    assert len(db.due[1]) == 40 - threshold
    assert all(r.attempts <= 1 for r in db.due[1])
    # The tick did not wait out the cool-down for them.
    assert time.t < CONF.CIRCUIT_BREAKER.cooldown_seconds


def test_after_the_cooldown_one_probe_is_claimed_and_its_success_reopens_the_channel():
    time = FakeTime()
    db = FakeDatabase(time)
    answers = iter([fails] * CONF.CIRCUIT_BREAKER.failure_threshold)
    rt = channel(time, 1, lambda m: next(answers, delivers)(m))
    db.add(1, CONF.CIRCUIT_BREAKER.failure_threshold)
    run_tick(time, db, [rt])
    assert rt.breaker.is_open
    db.due[1].clear()
    db.add(1, 20)
    time.advance(CONF.CIRCUIT_BREAKER.cooldown_seconds)
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
    assert 10.0 <= time.t < 10.0 + CLAIM_CHUNK_SIZE * 0.5
    assert all(at < 10.0 for at, _, _ in db.claims), "no claim starts past the deadline"
    # A chunk of 500 at 0.5 s a call outlasts its leases: what could not start within them went back.
    allowance = rt.config.start_allowance_seconds(CONF.LEASE_GRACE_SECONDS)
    assert all(at <= allowance for at, _ in provider(rt).calls) and allowance < time.t <= allowance + 0.5
    assert len(db.committed) + len(db.released) == stats.claims and not db.leased


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


def test_a_full_cap_whose_commits_the_database_refuses_gives_its_queue_back_at_the_deadline():
    from notifications_retry.delivery import CommitUnavailable
    from notifications_retry.engine.flow_control import InFlightCap
    from notifications_retry.providers.webhook import WebhookProvider
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

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
    executor = AnswersAtOnce(time)
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
