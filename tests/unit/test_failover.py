"""Failover's rules without a network: which failures may go to a fallback, and its flow control respected;
a tick builds the failover only when a record goes to a fallback."""

from __future__ import annotations

import pytest

from notifications_retry.conf import get_settings
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.failover import CIRCUIT_OPEN, Failover, eligible, not_called
from notifications_retry.engine.flow_control import FlowFeedback, Returned, sort_returns
from notifications_retry.engine.reporting import TickStats
from notifications_retry.exceptions import PermanentProviderError, RetryableProviderError
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.webhook import WebhookProvider
from notifications_retry.rules.outcomes import RETRY, SENT, THROTTLED, ClaimedRecord, Outcome, failure_of
from notifications_retry.runtime.asyncio_bridge import SteppedLoop
from tests.support.fake_tick import CONF, AnswersAtOnce, FakeDatabase, FakeLock, FakeTime, loop_dispatcher
from tests.unit.test_dispatcher_capacity import CHUNK, Log, Mono, record, runtime


def pair(fallback_concurrency: int = 2):
    primary, fallback = runtime(max_concurrency=1), runtime(max_concurrency=fallback_concurrency)
    primary.fallback = fallback
    return primary, fallback


def failover(mono: Mono) -> Failover:
    return Failover(None, FlowFeedback(mono, Log()), mono)  # type: ignore[arg-type]


def open_circuit(rt, now: float) -> None:
    for _ in range(get_settings().CIRCUIT_BREAKER.failure_threshold):
        rt.breaker.failure(now)
    assert rt.breaker.is_open


def test_only_temporary_unambiguous_failures_may_fail_over():
    refused = failure_of(RetryableProviderError("refused", kind="connection", ambiguous=False))
    timed_out = failure_of(RetryableProviderError("no answer", kind="timeout"))
    invalid = failure_of(PermanentProviderError("bad number", kind="http_4xx", ambiguous=False))
    assert not refused.ambiguous and timed_out.ambiguous
    assert eligible(Outcome(record(), RETRY, retriable=True, ambiguous=refused.ambiguous))
    assert not eligible(Outcome(record(), RETRY, retriable=True, ambiguous=True))
    assert not eligible(Outcome(record(), "terminal", retriable=invalid.retriable, ambiguous=False))
    assert not eligible(Outcome(record(), SENT, ambiguous=False))
    assert failure_of(ValueError("crash")).ambiguous  # an unknown error may have delivered


def test_a_fallback_is_reserved_only_within_its_circuit_pause_and_concurrency():
    mono = Mono()
    primary, fallback = pair(fallback_concurrency=1)
    route = failover(mono)
    assert route.reserve(primary, mono.now) is fallback and fallback.inflight == 1
    assert route.reserve(primary, mono.now) is None  # its one slot is taken
    fallback.inflight = 0
    fallback.paused_until = mono.now + 5
    assert route.reserve(primary, mono.now) is None
    fallback.paused_until = 0.0
    open_circuit(fallback, mono.now)
    assert route.reserve(primary, mono.now) is None
    assert route.reserve(runtime(), mono.now) is None  # no fallback at all


def test_a_bypassed_channel_claims_what_its_fallback_can_take_and_reroutes_its_queue():
    mono = Mono()
    primary, fallback = pair(fallback_concurrency=3)
    open_circuit(primary, mono.now)
    assert primary.bypassed(mono.now) and not primary.can_start(mono.now)
    assert primary.capacity(mono.now, CHUNK) == 3
    primary.queue.extend(record() for _ in range(4))
    rerouted, given_back = failover(mono).reroute(primary)
    assert len(rerouted) == 3 and len(primary.queue) == 1 and given_back == []
    assert all(item.fallback is fallback and item.why.kind == CIRCUIT_OPEN for item in rerouted)
    # The fallback's circuit opens too: what is left is given back, not held.
    open_circuit(fallback, mono.now)
    assert primary.capacity(mono.now, CHUNK) == 0
    left = primary.queue[0]
    assert failover(mono).reroute(primary) == ([], [left]) and not primary.queue


def test_without_a_fallback_an_open_circuit_claims_nothing():
    mono = Mono()
    rt = runtime()
    open_circuit(rt, mono.now)
    assert rt.capacity(mono.now, CHUNK) == 0


def test_a_paused_channel_with_a_fallback_keeps_its_queue_for_it():
    mono = Mono()
    primary, _ = pair()
    primary.queue.extend(record() for _ in range(2))
    feedback = FlowFeedback(mono, Log())
    throttled = Outcome(
        record(), RETRY, error_kind=THROTTLED, retriable=True, retry_after=30, ambiguous=False
    )
    assert feedback.account(primary, throttled) == [] and len(primary.queue) == 2
    assert primary.bypassed(mono.now)
    why = not_called(primary, mono.now)
    assert (why.kind, why.retry_after, why.ambiguous) == (THROTTLED, 30, False)


def test_the_lease_covers_the_primarys_call_and_the_fallbacks():
    primary, fallback = pair()
    alone = runtime().lease_seconds(get_settings())
    assert primary.lease_seconds(get_settings()) > alone + float(fallback.config.timeout_seconds)
    assert not primary.inline  # sent from the send loop, never inside a claim


def test_records_finished_calls_hand_back_are_held_for_a_throttle_or_given_back():
    primary, fallback = pair()
    held_records, given_records = [record(), record()], [record()]
    throttled = Outcome(record(), RETRY, error_kind=THROTTLED, retriable=True)
    circuit = Outcome(record(), RETRY, error_kind="connection", retriable=True)
    returns = [
        Returned(primary, throttled, held_records, 1.0),
        Returned(fallback, throttled, [], 1.0),
        Returned(fallback, circuit, given_records, 2.0),
    ]
    held, given_back = sort_returns(returns)
    # A throttle's records keep their channel and the moment of the pause; empty returns are dropped.
    assert [(r.rt, r.records, r.at) for r in held] == [(primary, held_records, 1.0)]
    assert given_back == given_records
    assert sort_returns([]) == ([], [])


class PrimaryRefused(AnswersAtOnce):
    """Channel ``hooks``' calls refused before anything went out (they may fail over); others' delivered."""

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        self.sent.append(record.id)
        if rt.key == "hooks":
            return Outcome(record, RETRY, error_kind="connection", retriable=True, ambiguous=False)
        return Outcome(record, SENT)


def webhook_channel(pk: int, key: str) -> ChannelRuntime:
    config = ChannelConfig(
        id=pk, key=key, provider_key="webhook", max_concurrency=4, timeout_seconds=5.0,
        options={"url": "https://hooks.example.com/in"},
    )  # fmt: skip
    return ChannelRuntime(
        config, WebhookProvider(config.settings()), CONF, max_concurrency=4, rate_limit=None
    )


@pytest.mark.parametrize("with_fallback", [False, True])
def test_a_tick_builds_the_failover_only_when_a_record_goes_to_a_fallback(with_fallback):
    time = FakeTime()
    db = FakeDatabase(time)
    rows = db.add(1, 3)
    rt = webhook_channel(1, "hooks")
    rt.reset_for_tick(rt.config)
    if with_fallback:
        rt.fallback = webhook_channel(2, "backup")
    loop = SteppedLoop()
    dispatcher, completer = loop_dispatcher(
        time, db, PrimaryRefused(time), loop, lambda: False, commit_delay=0.0
    )
    stats = TickStats(run_id="failover")
    dispatcher.reporter.begin_tick(stats, Log())
    try:
        deadline = time.t + 45.0
        dispatcher.run({1: rt}, stats, batch_size=1000, deadline=deadline, lock=FakeLock(time), bound=Log())  # type: ignore[arg-type]
        dispatcher.finish_calls(Log(), 5.0)
        while completer.pending:
            completer.commit(Log())
    finally:
        loop.close()
    assert sorted(o.record.id for o in db.committed) == sorted(r.id for r in rows)
    if with_fallback:
        assert dispatcher.failover is not None
        assert {(o.result, o.delivered_by) for o in db.committed} == {(SENT, "backup")}
    else:
        assert dispatcher.failover is None, "a tick whose channels have no fallback builds no failover"
        assert {o.result for o in db.committed} == {RETRY}
