"""Channels as the worker holds them: a provider and flow-control state per channel, kept across ticks.

A runtime is rebuilt only when its configuration changes (:func:`channel_fingerprint`), so a circuit
that opened, a Retry-After pause and the rate limiter's schedule survive from one tick to the next. A
channel found disabled during a tick (a 410 Gone, its failure ratio, an operator) is :attr:`stopped`:
no call starts on it, and nothing more is claimed for it, until a tick loads it enabled again.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Mapping
from typing import Any

import structlog

from notifications_retry.conf import RetrySettings
from notifications_retry.delivery.channel_rules import (
    QUEUE_ROUNDS,
    RATE_HORIZON_SECONDS,
    backoff_policy,
    lease_seconds,
    start_allowance_seconds,
)
from notifications_retry.engine.flow_control import CircuitBreaker, RateLimiter, StartPacer
from notifications_retry.engine.in_flight import InFlightCap
from notifications_retry.engine.tenant_limits import TenantLimits
from notifications_retry.models import ChannelConfig
from notifications_retry.observability import metrics
from notifications_retry.providers import Provider
from notifications_retry.rules.outcomes import ClaimedRecord

log = structlog.get_logger("notifications_retry.worker")


def channel_fingerprint(c: ChannelConfig) -> tuple[Any, ...]:
    """What, when changed, makes the worker rebuild a channel's provider and flow control."""
    return (
        c.provider_key,
        c.timeout_seconds,
        c.max_concurrency,
        c.rate_limit_per_second,
        repr(c.options),
        c.retry_backoff,
        c.backoff_base_seconds,
        c.backoff_cap_seconds,
        c.max_attempts,
    )


def _circuit_changed(channel: str, old: str, new: str) -> None:
    """Publish a breaker's state change as the gauge and a ``circuit-<state>`` log event."""
    metrics.CIRCUIT_STATE.labels(channel).set(metrics.CIRCUIT_STATE_VALUES[new])
    log.warning("circuit-" + new.replace("_", "-"), channel=channel, previous=old)


class ChannelRuntime:
    """A channel's provider, this lane's part of its limits, and its flow-control state."""

    def __init__(
        self,
        config: ChannelConfig,
        provider: Provider,
        conf: RetrySettings,
        *,
        max_concurrency: int,
        rate_limit: float | None,
        cap: InFlightCap | None = None,
        tenants: TenantLimits | None = None,
        lane_part: float = 1.0,
    ) -> None:
        self.config = config
        self.provider = provider
        #: The worker's cap on calls in flight, shared by all its channels (engine.in_flight).
        self.cap = cap if cap is not None else InFlightCap(None)
        #: The lane's part of the channel's limits; this worker's part is ``share`` of it (:meth:`set_share`).
        self.lane_concurrency, self.lane_rate, self.lane_part = max_concurrency, rate_limit, lane_part
        #: Per-tenant limits on this channel (engine.tenant_limits; None: TENANT_RATE_LIMITS is empty).
        self.tenants = tenants
        #: A claim cut short by a tenant's limit: the channel's next claim waits until then (monotonic).
        self.claim_after = 0.0
        self.max_concurrency = max_concurrency
        self.rate_limit = rate_limit
        self.limiter = RateLimiter(rate_limit)
        self.breaker = CircuitBreaker(
            conf.CIRCUIT_BREAKER.failure_threshold,
            conf.CIRCUIT_BREAKER.cooldown_seconds,
            on_change=functools.partial(_circuit_changed, config.key),
        )
        #: Spreads the starts of a channel sent on the send loop (engine.flow_control).
        self.pacer = StartPacer()
        self.paused_until = 0.0
        #: When the last pause began (monotonic): records held back later wait for the pause from then.
        self.paused_at = 0.0
        #: The fallback channel's runtime when it is usable in this lane this tick (engine.failover).
        self.fallback: ChannelRuntime | None = None
        self._inflight = 0
        self.queue: deque[ClaimedRecord] = deque()
        #: Queued records whose lease could no longer cover their call: the dispatcher gives them back.
        self.lapsed: list[ClaimedRecord] = []
        self.exhausted = False
        #: Why no call may start on this channel any more this tick ("": it may): it was found disabled.
        self.stopped = ""
        self.policy = backoff_policy(config, conf)

    @property
    def inline(self) -> bool:
        # A channel that may fail over is sent from the send loop: a fallback call must never run on
        # the worker's thread, nor inside a claim's transaction.
        return bool(self.provider.inline) and self.fallback is None

    @property
    def key(self) -> str:
        return self.config.key

    @property
    def inflight(self) -> int:
        """This channel's calls in flight (the worker's cap counts every channel's)."""
        return self._inflight

    @inflight.setter
    def inflight(self, value: int) -> None:
        self.cap.count += value - self._inflight
        self._inflight = value

    @property
    def concurrency(self) -> int:
        """The calls this channel may run at once in this worker: its part of ``max_concurrency``, and
        no more than the worker's own cap (fit_to_room shares the cap among channels)."""
        return min(self.max_concurrency, self.cap.limit or self.max_concurrency)

    @property
    def queued(self) -> int:
        """Records claimed and not started yet."""
        return len(self.queue)

    def lease_seconds(self, conf: RetrySettings) -> float:
        """This channel's lease (:func:`~notifications_retry.delivery.channel_rules.lease_seconds`)."""
        fallback = self.fallback.config if self.fallback is not None else None
        return lease_seconds(self.config, conf.LEASE_GRACE_SECONDS, fallback=fallback)

    def start_reserve(self, conf: RetrySettings) -> float:
        """What a record's lease must still hold when its call starts: its calls and half the grace (the
        lease less :func:`~notifications_retry.delivery.channel_rules.start_allowance_seconds`)."""
        fallback = self.fallback.config if self.fallback is not None else None
        allowance = start_allowance_seconds(self.config, conf.LEASE_GRACE_SECONDS, fallback=fallback)
        return self.lease_seconds(conf) - allowance

    def capacity(self, now_mono: float, chunk: int) -> int:
        """How many more records to claim for this channel now (0: none)."""
        if self.exhausted or self.stopped or now_mono < self.claim_after:
            return 0
        if now_mono < self.paused_until:
            return self._fallback_capacity(now_mono)
        if self.inline:
            wanted = chunk - len(self.queue)
        else:
            wanted = (QUEUE_ROUNDS + 1) * self.concurrency - self.inflight - len(self.queue)
        wanted = self.breaker.capacity(now_mono, wanted, queued=len(self.queue))
        if self.bypassed(now_mono):
            return self._fallback_capacity(now_mono)
        depth = wanted + len(self.queue)
        if self.limiter.limited:
            startable = self.limiter.available_within(now_mono, RATE_HORIZON_SECONDS)
            wanted = min(wanted, startable - len(self.queue))
            depth = min(depth, startable)
        # Refill in chunks, not a row per finished call: a claim is a statement on the worker's thread,
        # and claiming one row after every completion made the claims, not the provider, the limit.
        if self.queue and len(self.queue) > depth // 2:
            return 0
        return max(0, wanted)

    def bypassed(self, now_mono: float) -> bool:
        """Whether this channel's provider must not be called now: paused by the provider's Retry-After,
        circuit open, or half open with its one probe out. A channel with a fallback then sends through it."""
        if now_mono < self.paused_until:
            return True
        breaker = self.breaker
        if breaker.state == breaker.HALF_OPEN:
            return breaker.probe_in_flight
        return breaker.state == breaker.OPEN

    def _fallback_capacity(self, now_mono: float) -> int:
        """Records to claim for sending straight through the fallback: one round of its free slots."""
        fallback = self.fallback
        if fallback is None or not fallback.accepts_failover(now_mono):
            return 0
        free = fallback.max_concurrency - fallback.inflight - len(self.queue)
        if fallback.limiter.limited:
            startable = fallback.limiter.available_within(now_mono, RATE_HORIZON_SECONDS)
            free = min(free, startable - len(self.queue))
        return max(0, free)

    def accepts_failover(self, now_mono: float) -> bool:
        """Whether this channel, as a fallback, may be given other channels' attempts at all now: not
        paused, circuit not open (half open: only when its probe is not taken yet), not disabled."""
        if self.stopped or now_mono < self.paused_until:
            return False
        # Half open: the failover call becomes the probe, unless the channel's own probe is out or queued.
        return self.breaker.capacity(now_mono, 1, queued=len(self.queue)) > 0

    def can_take_failover(self, now_mono: float) -> bool:
        """Whether a failover call may start on this (fallback) channel right now: accepted, a rate slot
        ready, a concurrency slot free."""
        return (
            self.accepts_failover(now_mono)
            and self.limiter.ready(now_mono)
            and self.inflight < self.max_concurrency
            and self.cap.free
        )

    def blocked_until(self) -> float:
        """When a pause or an open circuit stops blocking this channel (monotonic; 0.0: never blocked)."""
        until = self.paused_until
        if self.breaker.state == self.breaker.OPEN:
            until = max(until, self.breaker.opened_at + self.breaker.cooldown)
        return until

    def begin(self, now_mono: float) -> None:
        """A send starts now: spend a rate-limit slot, and count a half-open circuit's probe."""
        self.limiter.take(now_mono)
        self.breaker.started()

    @property
    def paced(self) -> bool:
        """Whether its records start at a rate limiter's pace: the channel's own, or its tenants'."""
        return self.limiter.limited or self.tenants is not None

    def cannot_send(self, now_mono: float) -> bool:
        """Whether queued records cannot start before the pause or the circuit's cool-down ends (half
        open, they wait for the probe's answer)."""
        return now_mono < self.paused_until or self.breaker.state == self.breaker.OPEN

    def can_start(self, now_mono: float) -> bool:
        """Whether a send on this channel's own provider may start now."""
        if self.stopped or self.bypassed(now_mono) or not self.limiter.ready(now_mono):
            return False
        return self.inline or (self.inflight < self.max_concurrency and self.cap.free)

    def start_delay(self, now: float) -> float:
        """Seconds to put off a call about to start on the send loop, so a burst of starts is spread
        (``now`` on the loop's clock). A rate-limited channel is spaced by its limiter instead, and a
        circuit's probe is never put off."""
        if self.paced or self.breaker.state != self.breaker.CLOSED:
            return 0.0
        return self.pacer.delay(now, self.concurrency)

    def set_share(self, share: float) -> None:
        """Use ``share`` (0 to 1) of the lane's limits: the part of the partitions this worker owns.

        Partitions have one owner each, so the workers' shares add up to at most the whole limit. A
        channel keeps one call at least (a channel whose ``max_concurrency`` is below the number of
        workers may have one call per worker; docs/operations.md, "Scaling out").
        """
        self.max_concurrency = max(1, math.floor(self.lane_concurrency * share + 1e-9))
        self.rate_limit = self.lane_rate * share if self.lane_rate else None
        self.limiter.set_rate(self.rate_limit)
        if self.tenants is not None:
            self.tenants.set_part(self.lane_part * share)

    def next_startable(self, now_mono: float) -> ClaimedRecord | None:
        """The next queued record, taken off the queue, if a send may start on it now (one of a limited
        tenant may wait for its slot while another tenant's goes ahead).

        A record queued past its ``start_by`` (calls that each took their whole timeout) is not
        started: its lease could end during the call. It moves to :attr:`lapsed`, to be given back.
        """
        while self.queue and self.can_start(now_mono):
            record = self.queue.popleft() if self.tenants is None else self.tenants.pop(self.queue, now_mono)
            if record is None or now_mono <= record.start_by:
                return record
            self.lapsed.append(record)
        return None

    def take_lapsed(self) -> list[ClaimedRecord]:
        """The records :meth:`next_startable` set aside, to give back."""
        lapsed, self.lapsed = self.lapsed, []
        return lapsed

    def start_wait(self, now_mono: float) -> float:
        """Seconds until the rate limits may let a queued record start (0.0: now)."""
        wait = self.limiter.wait_time(now_mono)
        if self.tenants is not None:
            wait = max(wait, self.tenants.wait_time(self.queue, now_mono))
        return wait

    def reset_for_tick(self, config: ChannelConfig) -> None:
        """A new tick: fresh config row, nothing queued (calls still in flight keep their count)."""
        self.config = config
        self.exhausted = False
        self.stopped = ""  # loaded enabled: re-enabled since, or the disable was never committed
        self.claim_after = 0.0
        self.queue.clear()
        self.lapsed.clear()
        if self.tenants is not None:
            self.tenants.queued.clear()


def next_wait(runtimes: Mapping[int, ChannelRuntime], now_mono: float) -> float:
    """How long the dispatcher may wait before a queued record may start or a channel claim again
    (between 1 ms and 50 ms)."""
    waits = [rt.start_wait(now_mono) for rt in runtimes.values() if rt.queue]
    waits += [rt.claim_after - now_mono for rt in runtimes.values()]
    return max(0.001, min([0.05, *[w for w in waits if w > 0]]))
