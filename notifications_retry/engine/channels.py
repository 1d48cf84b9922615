"""Channels as the worker holds them: a provider and flow-control state per channel, kept across ticks.

A runtime is rebuilt only when its configuration changes (:func:`channel_fingerprint`), so a circuit
that opened, a Retry-After pause and the rate limiter's schedule survive from one tick to the next.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

import structlog
from django.db.models import Count

from notifications_retry.conf import RetrySettings
from notifications_retry.engine.flow_control import CircuitBreaker, RateLimiter
from notifications_retry.lanes import LaneSettings, shared_limits
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.observability import metrics
from notifications_retry.outcomes import ClaimedRecord
from notifications_retry.providers import Provider, get_provider_class
from notifications_retry.retry import BackoffPolicy

log = structlog.get_logger("notifications_retry.worker")

#: How far ahead a rate-limited channel may claim: records it can start within this many seconds.
RATE_HORIZON_SECONDS = 0.25
#: Rounds of this lane's max_concurrency a non-inline channel keeps claimed behind its calls in flight:
#: one, so a slot that frees up finds its next record waiting without a claim, while a crash strands
#: at most one round of unstarted rows (and leases stay short).
QUEUE_ROUNDS = 1


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
    ) -> None:
        self.config = config
        self.provider = provider
        self.max_concurrency = max_concurrency
        self.rate_limit = rate_limit
        self.limiter = RateLimiter(rate_limit)
        self.breaker = CircuitBreaker(
            conf.CIRCUIT_FAILURE_THRESHOLD,
            conf.CIRCUIT_COOLDOWN_SECONDS,
            on_change=functools.partial(_circuit_changed, config.key),
        )
        self.paused_until = 0.0
        self.inflight = 0
        self.queue: deque[ClaimedRecord] = deque()
        self.exhausted = False
        self.policy = BackoffPolicy(
            kind=config.retry_backoff,
            base_seconds=float(config.backoff_base_seconds),
            cap_seconds=float(config.backoff_cap_seconds),
            jitter_ratio=conf.JITTER_RATIO,
        )

    @property
    def inline(self) -> bool:
        return bool(self.provider.inline)

    @property
    def key(self) -> str:
        return self.config.key

    def lease_seconds(self, conf: RetrySettings) -> float:
        """Long enough for the round queued ahead of a record and its own call, plus a grace period."""
        timeout = float(self.config.timeout_seconds)
        return (QUEUE_ROUNDS + 1) * timeout + RATE_HORIZON_SECONDS + conf.LEASE_GRACE_SECONDS

    def capacity(self, now_mono: float, chunk: int) -> int:
        """How many more records to claim for this channel now (0: none)."""
        if self.exhausted or now_mono < self.paused_until:
            return 0
        if self.inline:
            wanted = chunk - len(self.queue)
        else:
            wanted = (QUEUE_ROUNDS + 1) * self.max_concurrency - self.inflight - len(self.queue)
        wanted = self.breaker.capacity(now_mono, wanted, queued=len(self.queue))
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

    def begin(self, now_mono: float) -> None:
        """A send starts now: spend a rate-limit slot, and count a half-open circuit's probe."""
        self.limiter.take(now_mono)
        self.breaker.started()

    def can_start(self, now_mono: float) -> bool:
        if now_mono < self.paused_until or not self.limiter.ready(now_mono):
            return False
        return self.inline or self.inflight < self.max_concurrency

    def reset_for_tick(self, config: ChannelConfig) -> None:
        """A new tick: fresh config row, nothing queued (calls still in flight keep their count)."""
        self.config = config
        self.exhausted = False
        self.queue.clear()


class ChannelSet:
    """The lane's usable channels, their runtimes cached across ticks; unusable ones reported."""

    def __init__(
        self,
        conf: RetrySettings,
        lanes: LaneSettings,
        lane: str,
        channels: Collection[str] | None,
        provider_factory: Callable[[ChannelConfig], Provider] | None = None,
    ) -> None:
        self.conf = conf
        self.lanes = lanes
        self.lane = lane
        self.channels = channels
        self.runtimes: dict[int, ChannelRuntime] = {}
        self._fingerprints: dict[int, tuple[Any, ...]] = {}
        self._factory = provider_factory or (lambda c: get_provider_class(c.provider_key)(c.settings()))

    def load(self, now: datetime, bound: Any) -> tuple[dict[int, ChannelRuntime], dict[str, int]]:
        """Usable channels of this lane, and how many due rows wait on each unusable one (by key)."""
        configs = list(ChannelConfig.objects.all())
        if self.channels is not None:
            configs = [c for c in configs if c.key in self.channels]
        usable: dict[int, ChannelRuntime] = {}
        unusable: dict[int, tuple[ChannelConfig, str]] = {}
        for config in configs:
            if not config.is_enabled:
                unusable[config.pk] = (config, "disabled")
                continue
            problems = config.configuration_problems()
            if problems:
                unusable[config.pk] = (config, "misconfigured: " + "; ".join(problems))
                continue
            usable[config.pk] = self._runtime(config)
        for pk in set(self.runtimes) - set(usable):
            self.runtimes.pop(pk).provider.close()
            self._fingerprints.pop(pk, None)
        waiting = self._report_unusable(unusable, now, bound) if unusable else {}
        return usable, waiting

    def _runtime(self, config: ChannelConfig) -> ChannelRuntime:
        fingerprint = channel_fingerprint(config)
        runtime = self.runtimes.get(config.pk)
        if runtime is None or self._fingerprints.get(config.pk) != fingerprint:
            if runtime is not None:
                runtime.provider.close()
            concurrency, rate = shared_limits(
                self.lanes,
                self.lane,
                config.key,
                max_concurrency=config.max_concurrency,
                rate_limit=float(config.rate_limit_per_second) if config.rate_limit_per_second else None,
            )
            runtime = ChannelRuntime(
                config, self._factory(config), self.conf, max_concurrency=concurrency, rate_limit=rate
            )
            # A new breaker starts closed; publishing it makes "circuit open" alerts resolvable.
            metrics.CIRCUIT_STATE.labels(config.key).set(metrics.CIRCUIT_STATE_VALUES["closed"])
            # Every labelled series at zero from the start, so a first batch of failures is an increase.
            metrics.precreate_series([config.key], metrics.BUILTIN_ERROR_KINDS, [])
            self.runtimes[config.pk] = runtime
            self._fingerprints[config.pk] = fingerprint
        runtime.reset_for_tick(config)
        return runtime

    def _report_unusable(
        self, unusable: Mapping[int, tuple[ChannelConfig, str]], now: datetime, bound: Any
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
            metrics.CHANNEL_DISABLED.labels(config.key).inc(count)
            bound.warning("channel-disabled", channel=config.key, due_waiting=count, reason=reason)
        return waiting

    def close(self) -> None:
        for runtime in self.runtimes.values():
            runtime.provider.close()
        self.runtimes.clear()
        self._fingerprints.clear()
