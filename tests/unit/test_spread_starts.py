"""A burst of starts spread on the send loop: which channels spread their starts and by how much, and
what a stop or a lost lock does to the starts put off. The real dispatcher runs on a real send loop
(``SteppedLoop``), on the fake clock and fake database port of :mod:`tests.support.fake_tick`."""

from __future__ import annotations

from typing import Any

import pytest

from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.reporting import TickStats
from notifications_retry.models import ChannelConfig
from notifications_retry.rules.outcomes import ClaimedRecord, Outcome
from tests.support.fake_tick import (
    CONF,
    AnswersAtOnce,
    FakeDatabase,
    FakeLock,
    FakeTime,
    loop_dispatcher,
    run_loop_tick,
)


def _webhook_channel(*, max_concurrency: int = 16, rate: float | None = None, cap: Any = None) -> Any:
    from notifications_retry.providers.webhook import WebhookProvider

    config = ChannelConfig(
        id=1, key="hooks", provider_key="webhook", max_concurrency=max_concurrency, timeout_seconds=5.0,
        rate_limit_per_second=rate, options={"url": "https://hooks.example.com/in"},
    )  # fmt: skip
    provider = WebhookProvider(config.settings())
    return ChannelRuntime(config, provider, CONF, max_concurrency=max_concurrency, rate_limit=rate, cap=cap)


def test_only_a_closed_unlimited_channel_spreads_its_starts_and_by_the_calls_it_may_run():
    from notifications_retry.engine.flow_control import PACE_MARGIN, InFlightCap

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


class _TimedAnswers(AnswersAtOnce):
    """Calls delivered at once, each moving the fake clock on by ``cost``."""

    def __init__(self, time: FakeTime, cost: float) -> None:
        super().__init__(time)
        self.time, self.cost = time, cost

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.time.advance(self.cost)
        return await super().send_async(rt, record)


def _paced_tick(
    time: FakeTime, db: FakeDatabase, executor: AnswersAtOnce, rt: ChannelRuntime, **run: Any
) -> TickStats:
    """One tick of ``rt`` on a real send loop, its starts spread (a mean call time of 12 ms)."""
    rt.pacer.observe(0.012)
    return run_loop_tick(time, db, executor, rt, **run)


def test_a_stop_during_a_spread_burst_sends_none_of_the_starts_put_off_and_gives_them_back():
    time = FakeTime()
    db = FakeDatabase(time)
    db.add(1, 40)
    executor, rt = AnswersAtOnce(time), _webhook_channel()
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


def test_a_stop_between_a_starts_spawn_and_its_first_step_sends_nothing_even_unspread():
    """A start's first step may come a while after the dispatcher's pass that made it a task (a loaded
    machine): with no spread at all (no call has ended yet), it still asks whether it may send."""
    from notifications_retry.database.locks import Ownership
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

    time, loop, stop = FakeTime(), SteppedLoop(), [False]
    db = FakeDatabase(time)
    rt = _webhook_channel(max_concurrency=4)
    rt.reset_for_tick(rt.config)
    rt.queue.extend(db.add(1, 6))
    executor = AnswersAtOnce(time)
    dispatcher, _ = loop_dispatcher(time, db, executor, loop, lambda: stop[0])
    dispatcher.ownership = Ownership(time.monotonic, 90.0)
    dispatcher.ownership.begin(time.t)
    try:
        dispatcher._start({1: rt})
        assert dispatcher.running == 4 and len(rt.queue) == 2, "four starts made tasks, not yet run"
        stop[0] = True
        loop.pause(0.0)
    finally:
        loop.close()
    assert executor.sent == [], "no start went out after the stop"
    assert len(rt.queue) == 6 and dispatcher.running == 0 and rt.inflight == 0, "all back in line"
