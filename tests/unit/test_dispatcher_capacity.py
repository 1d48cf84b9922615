"""How many records a channel claims and when a send may start: its share, queue, rate and circuit."""

from __future__ import annotations

from typing import Any

from notifications_retry.conf import get_settings
from notifications_retry.database.locks import Ownership
from notifications_retry.engine.channels import QUEUE_ROUNDS, RATE_HORIZON_SECONDS, ChannelRuntime
from notifications_retry.engine.flow_control import FlowFeedback
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.webhook import WebhookProvider
from notifications_retry.rules.backoff import LEASED_ROUNDS
from notifications_retry.rules.outcomes import RETRY, SENT, TERMINAL, ClaimedRecord, Outcome
from tests.support.records import claimed_record

CHUNK = 100


def runtime(max_concurrency=4, rate=None, timeout=5.0) -> ChannelRuntime:
    config = ChannelConfig(
        key="hooks",
        provider_key="webhook",
        max_concurrency=max_concurrency,
        rate_limit_per_second=rate,
        timeout_seconds=timeout,
        options={"url": "https://hooks.example.com/in"},
    )
    return ChannelRuntime(
        config,
        WebhookProvider(config.settings()),
        get_settings(),
        max_concurrency=max_concurrency,
        rate_limit=rate,
    )


def record(n: int = 0) -> ClaimedRecord:
    return claimed_record(recipient="r")


def test_a_channel_claims_its_calls_plus_its_queued_rounds_behind_them():
    rt = runtime(max_concurrency=4)
    assert rt.capacity(0.0, CHUNK) == (QUEUE_ROUNDS + 1) * 4
    rt.inflight = 4
    assert rt.capacity(0.0, CHUNK) == QUEUE_ROUNDS * 4


def test_a_half_full_queue_is_not_topped_up_row_by_row():
    rt = runtime(max_concurrency=4)
    rt.inflight = 4
    depth = QUEUE_ROUNDS * 4
    rt.queue.extend(record() for _ in range(depth // 2 + 1))
    assert rt.capacity(0.0, CHUNK) == 0
    rt.queue.pop()
    assert rt.capacity(0.0, CHUNK) == depth - depth // 2


def test_a_rate_limited_channel_claims_only_what_it_can_start_within_the_horizon():
    rt = runtime(max_concurrency=50, rate=20.0)
    assert rt.capacity(0.0, CHUNK) == int(RATE_HORIZON_SECONDS * 20) + 1
    rt.begin(0.0)
    assert not rt.can_start(0.01) and rt.can_start(0.05)


def test_concurrency_bounds_starts():
    rt = runtime(max_concurrency=2)
    rt.inflight = 2
    assert not rt.can_start(0.0)
    rt.inflight = 1
    assert rt.can_start(0.0)


def test_lease_covers_a_round_of_waiting_and_the_call_plus_grace_however_deep_the_queue():
    rt = runtime(timeout=5.0)
    grace = get_settings().LEASE_GRACE_SECONDS
    assert LEASED_ROUNDS == 1 < QUEUE_ROUNDS
    assert rt.lease_seconds(get_settings()) == 2 * 5.0 + RATE_HORIZON_SECONDS + grace


def test_a_queued_record_may_start_while_its_lease_still_holds_its_call_and_half_the_grace():
    rt = runtime(timeout=5.0)
    grace = get_settings().LEASE_GRACE_SECONDS
    assert rt.start_reserve(get_settings()) == 5.0 + grace / 2
    assert rt.config.start_allowance_seconds(grace) == 5.0 + RATE_HORIZON_SECONDS + grace / 2


def test_a_record_queued_past_its_start_by_is_set_aside_and_the_next_one_starts():
    rt = runtime(max_concurrency=4)
    late, fresh = record(), record()
    late.start_by, fresh.start_by = 10.0, 30.0
    rt.queue.extend([late, fresh])
    assert rt.next_startable(20.0) is fresh
    assert rt.take_lapsed() == [late] and rt.take_lapsed() == []


def test_a_record_may_start_at_its_start_by_and_no_queued_record_is_set_aside_while_none_may_start():
    rt = runtime(max_concurrency=1)
    due = record()
    due.start_by = 10.0
    rt.queue.append(due)
    rt.inflight = 1  # the one slot is taken: nothing is looked at, nothing set aside
    assert rt.next_startable(50.0) is None and rt.lapsed == []
    rt.inflight = 0
    assert rt.next_startable(10.0) is due


class Mono:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


class Log:
    def warning(self, *a, **k):
        pass


def test_throttling_pauses_the_channel_and_hands_back_its_queue():
    mono = Mono()
    rt = runtime()
    rt.queue.extend(record() for _ in range(3))
    feedback = FlowFeedback(mono, Log())
    returned = feedback.account(
        rt, Outcome(record(), RETRY, error_kind="throttled", retriable=True, retry_after=30)
    )
    assert len(returned) == 3 and not rt.queue
    assert rt.paused_until == 40.0 and rt.capacity(39.9, CHUNK) == 0 and not rt.can_start(39.9)
    assert rt.capacity(40.0, CHUNK) > 0


def test_consecutive_failures_open_the_circuit_and_hand_back_the_queue():
    mono = Mono()
    conf = get_settings()
    rt = runtime()
    feedback = FlowFeedback(mono, Log())
    failure = Outcome(record(), RETRY, error_kind="timeout", retriable=True)
    for _ in range(conf.CIRCUIT_BREAKER.failure_threshold - 1):
        assert feedback.account(rt, failure) == []
    rt.queue.extend(record() for _ in range(2))
    assert len(feedback.account(rt, failure)) == 2
    assert rt.breaker.is_open and rt.capacity(mono.now, CHUNK) == 0
    # After the cool-down a single probe may be claimed.
    assert rt.capacity(mono.now + conf.CIRCUIT_BREAKER.cooldown_seconds, CHUNK) == 1


def test_successes_and_permanent_failures_leave_the_queue_alone():
    rt = runtime()
    rt.queue.append(record())
    feedback = FlowFeedback(Mono(), Log())
    assert feedback.account(rt, Outcome(record(), SENT)) == []
    assert feedback.account(rt, Outcome(record(), TERMINAL, error_kind="bad_request")) == []
    assert len(rt.queue) == 1 and not rt.breaker.is_open


def dispatcher_on(loop: Any, executor: Any, *, monotonic: Any, completer: Any = None) -> Any:
    """A dispatcher whose slots run on ``loop`` (its other parts are not used by a slot)."""
    from notifications_retry.engine.dispatcher import Dispatcher

    return Dispatcher(
        conf=get_settings(),
        executor=executor,
        completer=completer,
        reporter=None,  # type: ignore[arg-type]
        send_loop=lambda: loop,
        monotonic=monotonic,
        stopping=lambda: False,
        lane_priorities=None,
    )


class _Executor:
    """Answers every send at once with a delivery, recording the records in order."""

    def __init__(self) -> None:
        self.sent: list[ClaimedRecord] = []

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.sent.append(record)
        return Outcome(record, SENT)


def test_a_finished_call_starts_the_next_queued_record_at_full_concurrency():
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

    loop = SteppedLoop()

    executor = _Executor()
    dispatcher = dispatcher_on(loop, executor, monotonic=lambda: 0.0, completer=None)
    dispatcher.ownership = Ownership(lambda: 0.0, idle_session_timeout=90)
    dispatcher.ownership.begin(0.0)  # the tick holds the cycle's lock, as run() starts it
    rt = runtime(max_concurrency=1)
    first, *queued = [record() for _ in range(4)]
    rt.queue.extend(queued)
    rt.inflight, dispatcher.running = 1, 1  # as the worker's thread starts a slot
    loop.run(dispatcher._slot(rt, first))
    loop.close()
    assert [r.id for r in executor.sent] == [first.id, *(r.id for r in queued)], (
        "the slot itself kept the channel busy, without waiting for the worker's thread"
    )
    assert rt.inflight == 0 and dispatcher.running == 0 and not rt.queue
    assert len(dispatcher.done) == 4


def test_a_slot_starts_no_next_call_once_its_ownership_is_unconfirmed():
    # A process resumed after a freeze: the lock was last seen held long ago (the standby has it now).
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

    loop = SteppedLoop()

    now = [0.0]

    class _FrozenDuringTheCall(_Executor):
        async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
            now[0] = 120.0  # frozen for two minutes during the call
            return await super().send_async(rt, record)

    executor = _FrozenDuringTheCall()
    dispatcher = dispatcher_on(loop, executor, monotonic=lambda: now[0], completer=None)
    dispatcher.ownership = Ownership(lambda: now[0], idle_session_timeout=90)
    dispatcher.ownership.begin(0.0)
    rt = runtime(max_concurrency=1)
    first, *queued = [record() for _ in range(3)]
    rt.queue.extend(queued)
    rt.inflight, dispatcher.running = 1, 1
    loop.run(dispatcher._slot(rt, first))
    loop.close()
    assert [r.id for r in executor.sent] == [first.id], "the answer is handed on, nothing new starts"
    assert list(rt.queue) == queued and len(dispatcher.done) == 1


def test_the_send_loop_keeps_a_signal_given_between_two_waits_and_runs_again_after_a_close():
    import time

    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

    loop = SteppedLoop()
    for _ in range(2):  # a worker run twice closes its loop in between
        loop.spawn([_signal_later(loop)])
        started = time.monotonic()
        loop.wait(5.0)  # ended by the task's signal, not by the timeout
        assert time.monotonic() - started < 4.0
        loop.signal()  # given while nobody waits: the next wait returns at once
        started = time.monotonic()
        loop.wait(5.0)
        assert time.monotonic() - started < 1.0
        loop.close()


async def _signal_later(loop: Any) -> None:
    import asyncio

    await asyncio.sleep(0.01)
    loop.signal()
