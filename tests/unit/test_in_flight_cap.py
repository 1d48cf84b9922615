"""A worker's cap on calls in flight across its channels (WORKER_MAX_IN_FLIGHT)."""

from __future__ import annotations

from notifications_retry.conf import get_settings
from notifications_retry.engine.channels import QUEUE_ROUNDS, ChannelRuntime
from notifications_retry.engine.flow_control import InFlightCap, fit_to_room
from notifications_retry.models import ChannelConfig
from notifications_retry.providers.in_app import InAppProvider
from notifications_retry.providers.webhook import WebhookProvider
from notifications_retry.rules.outcomes import SENT, Outcome
from tests.support.records import claimed_record

CHUNK = 100


def runtime(key: str, cap: InFlightCap, max_concurrency: int = 64, inline: bool = False) -> ChannelRuntime:
    config = ChannelConfig(
        key=key,
        provider_key="in_app" if inline else "webhook",
        max_concurrency=max_concurrency,
        timeout_seconds=5.0,
        options={} if inline else {"url": "https://hooks.example.com/in"},
    )
    provider = InAppProvider(config.settings()) if inline else WebhookProvider(config.settings())
    return ChannelRuntime(
        config, provider, get_settings(), max_concurrency=max_concurrency, rate_limit=None, cap=cap
    )


def test_calls_of_every_channel_count_against_the_one_cap():
    cap = InFlightCap(3)
    a, b = runtime("a", cap), runtime("b", cap)
    a.inflight = 2
    assert b.can_start(0.0)
    b.inflight = 1
    assert cap.count == 3
    assert not a.can_start(0.0) and not b.can_start(0.0)
    a.inflight -= 1
    assert b.can_start(0.0) and cap.count == 2


def test_one_channel_claims_by_the_cap_when_it_is_below_the_channels_concurrency():
    cap = InFlightCap(16)
    rt = runtime("a", cap, max_concurrency=64)
    assert rt.capacity(0.0, CHUNK) == (QUEUE_ROUNDS + 1) * 16


def test_channels_share_the_room_evenly_and_the_unneeded_part_goes_to_the_others():
    cap = InFlightCap(10)
    runtimes = {1: runtime("a", cap), 2: runtime("b", cap), 3: runtime("c", cap)}
    room = (QUEUE_ROUNDS + 1) * 10
    fitted = fit_to_room(runtimes, {1: 100, 2: 100, 3: 2})
    assert fitted[3] == 2 and sum(fitted.values()) == room
    assert abs(fitted[1] - fitted[2]) <= 1


def test_queued_records_and_calls_in_flight_use_up_the_room():
    cap = InFlightCap(10)
    runtimes = {1: runtime("a", cap), 2: runtime("b", cap)}
    runtimes[1].inflight = 10
    runtimes[2].queue.extend(claimed_record(recipient="r") for _ in range(4))
    fitted = fit_to_room(runtimes, {1: 50, 2: 50})
    assert sum(fitted.values()) == (QUEUE_ROUNDS + 1) * 10 - 10 - 4


def test_inline_channels_are_not_trimmed_and_no_cap_trims_nothing():
    cap = InFlightCap(1)
    runtimes = {1: runtime("inline", cap, inline=True), 2: runtime("b", cap)}
    assert fit_to_room(runtimes, {1: 500, 2: 50}) == {1: 500, 2: (QUEUE_ROUNDS + 1) * 1}
    free = InFlightCap(None)
    assert fit_to_room({1: runtime("a", free)}, {1: 500}) == {1: 500}


def test_a_finished_call_holds_its_slot_until_its_outcome_is_released():
    cap = InFlightCap(2)
    rt = runtime("a", cap)
    done = claimed_record(recipient="r")
    rt.inflight = 2
    rt.inflight -= 1
    cap.hold(done.id_text)
    assert not cap.free and not rt.can_start(0.0) and cap.waiting_for_commit
    cap.release([Outcome(done, SENT)])
    assert cap.free and rt.can_start(0.0) and not cap.waiting_for_commit


def test_slots_are_held_only_under_a_cap_and_a_tick_forgets_what_it_gave_up():
    free = InFlightCap(None)
    free.hold("x")
    assert not free.held and free.free and not free.waiting_for_commit
    cap = InFlightCap(1)
    cap.hold("y")
    assert not cap.free
    cap.forget_held()
    assert cap.free
