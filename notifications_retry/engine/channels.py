"""Channels as the worker holds them: a provider and flow-control state per channel, kept across ticks,
and the lane's set of them loaded before each tick (:class:`ChannelSet`, below).

A runtime is rebuilt only when its configuration changes (:func:`channel_fingerprint`), so a circuit
that opened, a Retry-After pause and the rate limiter's schedule survive from one tick to the next. A
channel found disabled during a tick (a 410 Gone, its failure ratio, an operator) is :attr:`stopped`:
no call starts on it, and nothing more is claimed for it, until a tick loads it enabled again.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

import structlog
from django.db import DatabaseError
from django.db.models import Count
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import LaneSettings, RetrySettings, shared_limits, tenant_rate_limits
from notifications_retry.conf import share as lane_share
from notifications_retry.engine.flow_control import CircuitBreaker, InFlightCap, RateLimiter, StartPacer
from notifications_retry.engine.tenant_limits import TenantLimits
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.observability import metrics
from notifications_retry.providers import Provider, get_provider_class
from notifications_retry.rules.backoff import QUEUE_ROUNDS, RATE_HORIZON_SECONDS
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
        #: The worker's cap on calls in flight, shared by all its channels (engine.flow_control).
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
        self.policy = config.backoff_policy(conf)

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
        """This channel's lease (``ChannelConfig.lease_seconds``)."""
        fallback = self.fallback.config if self.fallback is not None else None
        return self.config.lease_seconds(conf.LEASE_GRACE_SECONDS, fallback=fallback)

    def start_reserve(self, conf: RetrySettings) -> float:
        """What a record's lease must still hold when its call starts: its calls and half the grace (the
        lease less ``ChannelConfig.start_allowance_seconds``)."""
        fallback = self.fallback.config if self.fallback is not None else None
        allowance = self.config.start_allowance_seconds(conf.LEASE_GRACE_SECONDS, fallback=fallback)
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


# --------------------------------------------------------------------------------------------------
# The lane's channels as a worker loads them before each tick: their runtimes (engine.channels), kept across
# ticks and rebuilt when a channel's configuration changes, and the channels that cannot send reported
# (``channel-disabled``). In a worker that serves ``/metrics``, every configured channel of the lane, usable
# or not, has its labelled counter series at zero from the worker's start
# (:meth:`ChannelSet.precreate_series`), and a channel added later from the next load that reads it.
# --------------------------------------------------------------------------------------------------


class ChannelSet:
    """The lane's usable channels, their runtimes cached across ticks; unusable ones reported."""

    def __init__(
        self,
        conf: RetrySettings,
        lanes: LaneSettings,
        lane: str,
        channels: Collection[str] | None,
        provider_factory: Callable[[ChannelConfig], Provider] | None = None,
        cap: InFlightCap | None = None,
        *,
        serving_metrics: bool = True,
    ) -> None:
        self.conf = conf
        #: Whether this process serves ``/metrics``: only a scrape of it reads series created at zero.
        self.serving_metrics = serving_metrics
        #: The worker's cap on calls in flight, shared by every runtime of this set.
        self.cap = cap if cap is not None else InFlightCap(None)
        #: This worker's part of every channel's limits: its partitions' part (1.0 with one partition).
        self.share = 1.0
        self.lanes = lanes
        self.lane = lane
        self.channels = channels
        self.runtimes: dict[int, ChannelRuntime] = {}
        self._fingerprints: dict[int, tuple[Any, ...]] = {}
        #: The reason last logged for each unusable channel: ``channel-disabled`` is logged when it changes.
        self._reported: dict[int, str] = {}
        #: Channels (by key) and (channel, fallback) pairs whose labelled series exist already.
        self._series: set[str] = set()
        self._failover_series: set[tuple[str, str]] = set()
        self._factory = provider_factory or (lambda c: get_provider_class(c.provider_key)(c.settings()))

    def precreate_series(self) -> None:
        """Create the labelled counter series of every channel configured for this lane at zero, before
        the first tick: a scrape between the worker's start and a channel's first outcome sees 0, so
        ``increase()`` counts a first batch. A database that cannot be read now leaves it to the first
        tick's :meth:`load`, which does the same. A process that serves no ``/metrics`` reads nothing."""
        if not self.serving_metrics:
            return  # before reading every channel row for nothing
        try:
            every = list(ChannelConfig.objects.all())
        except DatabaseError:
            return
        self._precreate(self._served(every))

    def _served(self, every: list[ChannelConfig]) -> list[ChannelConfig]:
        return every if self.channels is None else [c for c in every if c.key in self.channels]

    def _precreate(self, configs: list[ChannelConfig]) -> None:
        """The series of ``configs`` not created yet (disabled and misconfigured channels too: they
        count ``channel_disabled``), and of each one's failovers to a channel of the lane; none in a
        process that serves no ``/metrics``."""
        if not self.serving_metrics:
            return
        new = [c.key for c in configs if c.key not in self._series]
        if new:
            metrics.precreate_series(new, metrics.BUILTIN_ERROR_KINDS, [])
            self._series.update(new)
        keys = {c.pk: c.key for c in configs}
        pairs = {
            (c.key, keys[c.fallback_id]) for c in configs if c.fallback_id in keys and c.fallback_id != c.pk
        } - self._failover_series
        if pairs:
            metrics.precreate_series([], [], [], failovers=sorted(pairs))
            self._failover_series |= pairs

    def load(
        self, now: datetime, bound: FilteringBoundLogger
    ) -> tuple[dict[int, ChannelRuntime], dict[str, int]]:
        """Usable channels of this lane, and how many due rows wait on each unusable one (by key)."""
        every = list(ChannelConfig.objects.all())
        configs = self._served(every)
        self._precreate(configs)
        usable: dict[int, ChannelRuntime] = {}
        unusable: dict[int, tuple[ChannelConfig, str]] = {}
        for config in configs:
            if not config.is_enabled:
                unusable[config.pk] = (config, "disabled")
                continue
            runtime, problems = self._guarded_runtime(config)
            if runtime is None:
                unusable[config.pk] = (config, "misconfigured: " + "; ".join(problems))
                continue
            usable[config.pk] = runtime
        for pk in set(self._reported) - set(unusable):
            del self._reported[pk]  # usable again (or gone): a later problem is news again
        for pk in set(self.runtimes) - set(usable):
            self.runtimes.pop(pk).provider.close()
            self._fingerprints.pop(pk, None)
        self._link_fallbacks(usable, {c.pk: c for c in every}, bound)
        waiting = self._report_unusable(unusable, now, bound) if unusable else {}
        return usable, waiting

    def _link_fallbacks(
        self,
        usable: dict[int, ChannelRuntime],
        every: Mapping[int, ChannelConfig],
        bound: FilteringBoundLogger,
    ) -> None:
        """Give each channel its fallback's runtime when that channel is usable here; say why not otherwise.

        One hop only: a fallback's own fallback is never used for another channel's attempt.
        """
        for rt in usable.values():
            fallback_id = rt.config.fallback_id
            rt.fallback = usable.get(fallback_id) if fallback_id not in (None, rt.config.pk) else None
            # A usable pair's failover series were created with the load's others (_precreate).
            if rt.fallback is None and fallback_id is not None:
                target = every.get(fallback_id)
                if target is None or fallback_id == rt.config.pk:
                    reason = "not a valid channel"
                elif not target.is_enabled:
                    reason = "disabled"
                elif self.channels is not None and target.key not in self.channels:
                    reason = f"not served by lane {self.lane!r}"
                else:
                    reason = "misconfigured"
                bound.warning(
                    "channel-fallback-unusable",
                    channel=rt.key,
                    fallback=target.key if target is not None else fallback_id,
                    reason=reason,
                )

    def _guarded_runtime(self, config: ChannelConfig) -> tuple[ChannelRuntime | None, list[str]]:
        """The channel's runtime, or why it cannot send: a provider that raises on its options (its
        checks or its constructor) makes that channel wait, never the others."""
        try:
            problems = config.configuration_problems()
            if problems:
                return None, problems
            return self._runtime(config), []
        except Exception as exc:
            self._fingerprints.pop(config.pk, None)  # rebuilt from scratch once the row is fixed
            return None, [f"its provider cannot be built: {type(exc).__name__}: {exc}"]

    def _runtime(self, config: ChannelConfig) -> ChannelRuntime:
        fingerprint = channel_fingerprint(config)
        runtime = self.runtimes.get(config.pk)
        if runtime is None or self._fingerprints.get(config.pk) != fingerprint:
            if runtime is not None:
                runtime.provider.close()
            default, named = tenant_rate_limits(self.conf)
            concurrency, rate = shared_limits(
                self.lanes,
                self.lane,
                config.key,
                max_concurrency=config.max_concurrency,
                rate_limit=float(config.rate_limit_per_second) if config.rate_limit_per_second else None,
            )
            runtime = ChannelRuntime(
                config,
                self._factory(config),
                self.conf,
                max_concurrency=concurrency,
                rate_limit=rate,
                cap=self.cap,
                tenants=TenantLimits(default, named) if default is not None or named else None,
                lane_part=lane_share(self.lanes, self.lane, config.key),
            )
            # A new breaker starts closed; publishing it makes "circuit open" alerts resolvable.
            metrics.CIRCUIT_STATE.labels(config.key).set(metrics.CIRCUIT_STATE_VALUES["closed"])
            self.runtimes[config.pk] = runtime
            self._fingerprints[config.pk] = fingerprint
        runtime.reset_for_tick(config)
        runtime.set_share(self.share)
        return runtime

    def _report_unusable(
        self, unusable: Mapping[int, tuple[ChannelConfig, str]], now: datetime, bound: FilteringBoundLogger
    ) -> dict[str, int]:
        counts = (
            NotificationEntity.objects.due(now)
            .filter(channel_id__in=list(unusable))
            .values_list("channel_id")
            .order_by()
            .annotate(count=Count("pk"))
        )
        waiting: dict[str, int] = {}
        for cid, count in counts:
            config, reason = unusable[cid]
            waiting[config.key] = count
            # The metric counts every tick's skipped rows; the log says when a channel's state changes.
            metrics.CHANNEL_DISABLED.labels(config.key).inc(count)
            if self._reported.get(cid) != reason:
                self._reported[cid] = reason
                bound.warning("channel-disabled", channel=config.key, due_waiting=count, reason=reason)
        return waiting

    def close(self) -> None:
        for runtime in self.runtimes.values():
            runtime.provider.close()
        self.runtimes.clear()
        self._fingerprints.clear()


__all__ = ["ChannelSet"]
