"""The lane's channels as a worker loads them before each tick: their runtimes (engine.channels), kept
across ticks and rebuilt when a channel's configuration changes, and the channels that cannot send
reported (``channel-disabled``). Every configured channel of the lane, usable or not, has its labelled
counter series at zero from the worker's start (:meth:`ChannelSet.precreate_series`), and a channel
added later from the next load that reads it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.models import Count
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import RetrySettings, tenant_rate_limits
from notifications_retry.conf.lanes import LaneSettings, shared_limits
from notifications_retry.conf.lanes import share as lane_share
from notifications_retry.engine.channels import ChannelRuntime, channel_fingerprint
from notifications_retry.engine.in_flight import InFlightCap
from notifications_retry.engine.tenant_limits import TenantLimits
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.observability import metrics
from notifications_retry.providers import Provider, get_provider_class


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
    ) -> None:
        self.conf = conf
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
        tick's :meth:`load`, which does the same."""
        try:
            every = list(ChannelConfig.objects.all())
        except DatabaseError:
            return
        self._precreate(self._served(every))

    def _served(self, every: list[ChannelConfig]) -> list[ChannelConfig]:
        return every if self.channels is None else [c for c in every if c.key in self.channels]

    def _precreate(self, configs: list[ChannelConfig]) -> None:
        """The series of ``configs`` not created yet (disabled and misconfigured channels too: they
        count ``channel_disabled``), and of each one's failovers to a channel of the lane."""
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
            if rt.fallback is not None:
                metrics.precreate_series([], [], [], failovers=[(rt.key, rt.fallback.key)])
            elif fallback_id is not None:
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
