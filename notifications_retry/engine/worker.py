"""The retry worker: one tick claims due records, sends them, finalizes them.

Plain Python: the management command only parses options. Tests call :class:`Worker` directly
with an injected clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import queue
import random
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from types import FrameType
from typing import Any

import psycopg
import structlog
from django.db import DatabaseError, InterfaceError, connection
from django.db.models import Count

from notifications_retry.clock import Clock, default_clock
from notifications_retry.conf import RetrySettings, get_settings
from notifications_retry.delivery import (
    RETRY,
    SENT,
    TERMINAL,
    ChannelClaim,
    ClaimedRecord,
    Outcome,
    attempt_budget,
    claim_due,
    finalize,
    release,
)
from notifications_retry.engine import failures, lane_shares
from notifications_retry.engine.flow_control import CircuitBreaker, RateLimiter
from notifications_retry.engine.send_loop import SendLoop
from notifications_retry.exceptions import ProviderError
from notifications_retry.locks import AdvisoryLock
from notifications_retry.models import ChannelConfig, NotificationEntity, WorkerHeartbeat
from notifications_retry.observability import metrics, tracing
from notifications_retry.observability.logging import redact
from notifications_retry.providers import OutgoingMessage, Provider, get_provider_class
from notifications_retry.providers.base import SendResult
from notifications_retry.retry import BackoffPolicy, next_attempt_at
from notifications_retry.signals import terminal_failure

log = structlog.get_logger("notifications_retry.worker")

#: How far ahead a rate-limited channel may claim: records it can start within this many seconds.
RATE_HORIZON_SECONDS = 0.25
#: A provider call that outlives its channel timeout by this much is abandoned as a timeout.
ABANDON_GRACE_SECONDS = 1.0
#: Rounds of max_concurrency records a non-inline channel keeps claimed behind its calls in flight.
#: Six, not three: a finalize of 100 outcomes holds the worker's thread ~50 ms, and at 1,200 sends/s
#: three rounds of 32 ran dry behind it (slots idle 10 % of the time, measured).
QUEUE_ROUNDS = 6
#: After the first finished call, wait this long for more before collecting: waking the worker's
#: thread once per finished call cost a GIL hand-off per call and delayed the send loop.
COLLECT_DELAY_SECONDS = 0.002
#: How often, at most, a claim is preceded by a check that the cycle's lock is still ours. Losing it
#: late costs nothing worse than a second owner's SKIP LOCKED claims and token-guarded finalizes.
LOCK_CHECK_SECONDS = 0.5
DEFAULT_LANE = lane_shares.DEFAULT_LANE


@dataclasses.dataclass
class TickStats:
    """What one tick did."""

    run_id: str
    lane: str = DEFAULT_LANE
    skipped: bool = False
    processed: int = 0
    sent: int = 0
    retried: int = 0
    terminal: int = 0
    stale: int = 0
    finalize_failed: int = 0
    channel_disabled: int = 0
    claims: int = 0
    lock_lost: bool = False
    stopped: bool = False
    deadline_reached: bool = False
    duration_ms: float = 0.0
    error: str = ""  # one line: what failed on the database (engine.failures); empty when none did
    error_kind: str = ""
    skip_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class ChannelRuntime:
    """A channel's provider and flow-control state, kept across ticks while its config is unchanged."""

    def __init__(self, config: ChannelConfig, provider: Provider, conf: RetrySettings) -> None:
        self.config = config
        self.provider = provider
        self.limiter = RateLimiter(config.rate_limit_per_second)
        self.breaker = CircuitBreaker(
            conf.CIRCUIT_FAILURE_THRESHOLD,
            conf.CIRCUIT_COOLDOWN_SECONDS,
            on_change=functools.partial(_circuit_changed, config.key),
        )
        self.paused_until = 0.0
        # Lanes sending on this channel now, this one included: they split its limits evenly.
        self.share = 1
        # Held back while joining: the lanes already sending on it have not scaled down yet.
        self.held = False
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

    @property
    def max_concurrency(self) -> int:
        """This lane's part of the channel's concurrency (at least one call)."""
        return max(1, self.config.max_concurrency // self.share)

    @property
    def rate_limit(self) -> float | None:
        """This lane's part of the channel's rate limit, sends per second (``None``: no limit)."""
        rate = self.config.rate_limit_per_second
        return float(rate) / self.share if rate else None

    @property
    def limits_shared(self) -> bool:
        """Whether the split lowers this lane's limits (else a joining lane has nothing to wait for)."""
        return bool(self.config.rate_limit_per_second) or self.config.max_concurrency > 1

    @property
    def over_limit(self) -> bool:
        """More lanes than calls allowed: each keeps one call, so together they exceed the limit."""
        return self.share > self.config.max_concurrency

    def set_share(self, share: int) -> bool:
        """Split the channel's limits among ``share`` lanes; True when the split changed."""
        if share == self.share:
            return False
        self.share = share
        self.limiter.set_rate(self.rate_limit)
        return True

    def lease_seconds(self, conf: RetrySettings) -> float:
        """Long enough for the queue ahead of a record and its own call, plus a grace period."""
        timeout = float(self.config.timeout_seconds)
        # Every queued record ahead of this one may take a whole timeout, one slot-round at a time.
        return (QUEUE_ROUNDS + 1) * timeout + RATE_HORIZON_SECONDS + conf.LEASE_GRACE_SECONDS

    def capacity(self, now_mono: float, conf: RetrySettings) -> int:
        """How many more records to claim for this channel now (0: none)."""
        if self.exhausted or self.held or now_mono < self.paused_until:
            return 0
        if self.inline:
            wanted = conf.CLAIM_CHUNK_SIZE - len(self.queue)
        else:
            # Keep rounds queued behind the calls in flight, so slots never wait for a claim and
            # claims come in chunks of at least a round.
            wanted = (QUEUE_ROUNDS + 1) * self.max_concurrency - self.inflight - len(self.queue)
        wanted = self.breaker.capacity(now_mono, wanted, queued=len(self.queue))
        depth = wanted + len(self.queue)
        if self.limiter.limited:
            startable = self.limiter.available_within(now_mono, RATE_HORIZON_SECONDS)
            wanted = min(wanted, startable - len(self.queue))
            depth = min(depth, startable)
        # Refill in chunks, not a row per finished call: a claim is a statement on the loop's thread,
        # and claiming one row after every completion made the claims, not the provider, the limit.
        if self.queue and len(self.queue) > depth // 2:
            return 0
        return max(0, wanted)

    def begin(self, now_mono: float) -> None:
        """A send starts now: spend a rate-limit slot, and count a half-open circuit's probe."""
        self.limiter.take(now_mono)
        self.breaker.started()

    def can_start(self, now_mono: float) -> bool:
        if self.held or now_mono < self.paused_until or not self.limiter.ready(now_mono):
            return False
        return self.inline or self.inflight < self.max_concurrency


class _InFlight:
    """Calls in flight, shared by the worker's thread and the send loop's.

    One lock guards it and every pop from a channel's queue: a send that finishes starts the
    channel's next queued record itself, so a slot never waits for the worker's thread while that
    thread is busy claiming or finalizing.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0  # calls started and not yet in ``done``
        self.done: queue.SimpleQueue[tuple[ChannelRuntime, Outcome]] = queue.SimpleQueue()

    def start(self, rt: ChannelRuntime) -> None:
        """Count a call that starts (the caller holds the lock and has checked ``rt.can_start``)."""
        rt.begin(time.monotonic())
        self.running += 1

    def finish(self, rt: ChannelRuntime, outcome: Outcome) -> None:
        """Hand a finished call's outcome to the worker's thread (the caller holds the lock)."""
        self.running -= 1
        self.done.put((rt, outcome))


def _circuit_changed(channel: str, old: str, new: str) -> None:
    """Publish a breaker's state change as the gauge and a ``circuit-<state>`` log event."""
    metrics.CIRCUIT_STATE.labels(channel).set(metrics.CIRCUIT_STATE_VALUES[new])
    log.warning("circuit-" + new.replace("_", "-"), channel=channel, previous=old)


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


class Worker:
    """Runs ticks: single owner by advisory lock, claim → call → finalize, graceful stop."""

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        max_duration: float | None = None,
        interval: float | None = None,
        lane: str | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.conf = get_settings()
        self.batch_size = batch_size if batch_size is not None else self.conf.BATCH_SIZE
        self.max_duration = max_duration if max_duration is not None else self.conf.MAX_DURATION_SECONDS
        self.interval = interval if interval is not None else self.conf.INTERVAL_SECONDS
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.max_duration <= 0:
            raise ValueError(f"max duration must be > 0, got {self.max_duration}")
        if self.interval < 0:
            raise ValueError(f"interval must be >= 0, got {self.interval}")
        self.lane = lane or DEFAULT_LANE
        lane_conf: Mapping[str, Any] = {}
        if lane and lane != DEFAULT_LANE:
            if lane not in self.conf.LANES:
                raise ValueError(
                    f"unknown lane {lane!r}; configured lanes: {sorted(self.conf.LANES) or 'none'}"
                )
            lane_conf = self.conf.LANES[lane]
        self.lane_priorities: list[int] | None = list(lane_conf.get("priorities") or []) or None
        self.lane_channels = lane_shares.lane_channels(self.conf.LANES, self.lane)
        self.clock = clock or default_clock(self.conf.CLOCK)
        self.rng = rng or random.Random()
        self._sleep = sleep
        lock_name = self.conf.LOCK_KEY if self.lane == DEFAULT_LANE else f"{self.conf.LOCK_KEY}:{self.lane}"
        self.lock = AdvisoryLock(
            lock_name,
            using=self.conf.LOCK_DATABASE_ALIAS,
            idle_session_timeout=self.conf.LOCK_IDLE_SESSION_TIMEOUT_SECONDS,
        )
        self._stop = threading.Event()
        self._runtimes: dict[int, ChannelRuntime] = {}
        self._fingerprints: dict[int, tuple[Any, ...]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._send_loop: SendLoop | None = None
        self._flight = _InFlight()
        # The running tick's id and trace context, for record spans started in pool threads.
        self._run_id: str | None = None
        self._trace_parent: Any = None
        # Whether record spans are built, decided once a tick (asking costs an environment lookup).
        self._tracing = False
        # Looping (run without once): the lane stays on the board between ticks, see lane_shares.
        self._looping = False
        self._board = lane_shares.LaneBoard(self.lane, self.conf.LANES)
        self._backoff = failures.Backoff(self.interval)

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self, *_: Any) -> None:
        """Ask for a graceful stop: no new claims; records in hand are finished and finalized."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker at the next record boundary."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("stop-requested", signal=signal.Signals(signum).name, lane=self.lane)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, once: bool = False) -> list[TickStats]:
        """Tick once, or every ``interval`` seconds until stopped; returns the ticks' stats."""
        ticks: list[TickStats] = []
        self._looping = not once
        try:
            while True:
                started = time.monotonic()
                ticks.append(self.tick())
                if once or self.stopping:
                    break
                # A tick never overlaps the next: wait the rest of the interval, waking on stop.
                remaining = self._backoff.pause(bool(ticks[-1].error)) - (time.monotonic() - started)
                if remaining > 0:
                    if self._sleep is not None:
                        self._sleep(remaining)
                    elif self._stop.wait(remaining):
                        break
                if len(ticks) > 1000:
                    ticks = ticks[-1000:]
        finally:
            self._looping = False
            self._leave_board()
            self.close()
        return ticks

    def close(self) -> None:
        """Release the lock, the providers' connections, the send loop and the thread pool."""
        self.lock.close()
        for runtime in self._runtimes.values():
            runtime.provider.close()
        self._runtimes.clear()
        self._fingerprints.clear()
        if self._send_loop is not None:
            self._send_loop.close()
            self._send_loop = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- one tick ------------------------------------------------------------------------------

    def tick(self) -> TickStats:
        """One cycle: take the lock or skip; claim, send and finalize until done, the batch is full,
        the max duration has passed, or a stop was asked for."""
        stats = TickStats(run_id=uuid.uuid4().hex, lane=self.lane)
        started = time.monotonic()
        bound = log.bind(job_run_id=stats.run_id, lane=self.lane)
        try:
            _drop_broken_connection()
            if not self.lock.acquire():
                if self.lock.last_error is not None:
                    raise self.lock.last_error
                stats.skipped, stats.skip_reason = True, failures.LOCK_HELD
                bound.info("retry-cycle-skipped", reason=stats.skip_reason)
                return stats
            metrics.LOCK_HELD.labels(self.lane).set(1)
            metrics.LAST_TICK_STARTED.labels(self.lane).set(time.time())
            try:
                self.clock.sync()
                bound.info(
                    "retry-cycle-started", batch_size=self.batch_size, max_duration_s=self.max_duration
                )
                self._heartbeat(started_at=self.clock.now())
                with tracing.span(
                    "notifications_retry.tick", job_run_id=stats.run_id, lane=self.lane
                ) as span:
                    self._run_id, self._trace_parent = stats.run_id, tracing.current_context()
                    self._tracing = tracing.enabled()
                    self._cycle(stats, started, bound)
                    tracing.set_attributes(
                        span,
                        processed=stats.processed,
                        sent=stats.sent,
                        retried=stats.retried,
                        terminal=stats.terminal,
                    )
            finally:
                # Before the lock goes: once another instance of this lane owns it, this one must
                # not touch the lane's place on the board.
                self._board.end_tick(self._looping, self.interval, bool(self._flight.running), bound)
                self.lock.release()
                metrics.LOCK_HELD.labels(self.lane).set(0)
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            failure = failures.classify(exc, self.lock.using if exc is self.lock.last_error else "default")
            if failure is None:
                raise
            # Unreachable or not migrated: one line, drop the connection, let the next tick reconnect.
            stats.error, stats.error_kind = failure.message, failure.kind
            bound.error("retry-cycle-database-error", error=failure.message, kind=failure.kind)
            connection.close()
            self.lock.close()
            return stats
        stats.duration_ms = (time.monotonic() - started) * 1000
        metrics.CYCLE_DURATION.labels(self.lane).observe(stats.duration_ms)
        metrics.LAST_CYCLE_DURATION.labels(self.lane).set(stats.duration_ms)
        self._after_tick(stats, bound)
        return stats

    def _cycle(self, stats: TickStats, started: float, bound: Any) -> None:
        runtimes = self._load_channels(stats, bound)
        board = self._board
        board.begin_tick(runtimes.values(), time.monotonic(), bound)
        held_have_due: bool | None = None  # asked once, when only held channels are left
        deadline = started + self.max_duration
        remaining = self.batch_size
        flight = self._flight
        results: list[Outcome] = []
        claiming = True
        flush_at = max(1, min(self.conf.CLAIM_CHUNK_SIZE, self.batch_size))
        lock_checked_at, lock_ok = -LOCK_CHECK_SECONDS, False

        while True:
            now_mono = time.monotonic()
            board.refresh(runtimes.values(), now_mono, bound)
            if claiming and (self.stopping or now_mono >= deadline or remaining <= 0):
                claiming = False
                stats.stopped = self.stopping
                stats.deadline_reached = now_mono >= deadline
            if self.stopping and any(rt.queue for rt in runtimes.values()):
                self._release_queued(runtimes, bound)
            if claiming:
                plan = [
                    ChannelClaim(cid, rt.capacity(now_mono, self.conf), rt.lease_seconds(self.conf))
                    for cid, rt in runtimes.items()
                ]
                plan = [p for p in plan if p.limit > 0]
                if plan:
                    if time.monotonic() - lock_checked_at >= LOCK_CHECK_SECONDS:
                        lock_checked_at = time.monotonic()
                        lock_ok = self.lock.still_held()
                    if not lock_ok:
                        stats.lock_lost = True
                        board.lock_lost()
                        bound.error("retry-cycle-lock-lost")
                        claiming = False
                    else:
                        self._claim(plan, remaining, runtimes, stats, results, bound)
                        remaining = self.batch_size - stats.claims
            self._dispatch(runtimes, results, bound)
            # Collect finished calls (a hung one is reported as a timeout by its own task).
            wait = self._wait_time(runtimes) if flight.running else 0
            # Batch completions, unless a rate-limited channel waits to start its next send: a start
            # delayed past its slot is throughput lost for good (the bucket never bursts to catch up).
            pacing = any(rt.queue and rt.limiter.limited for rt in runtimes.values())
            for rt, outcome in self._completed(flight.done, wait, 0 if pacing else COLLECT_DELAY_SECONDS):
                results.append(outcome)
                self._account(rt, outcome, results, bound)
            with flight.lock:
                queued = any(rt.queue for rt in runtimes.values())
                idle = not flight.running and flight.done.empty() and not queued
                calls = bool(flight.running)
            if results and (len(results) >= flush_at or idle or not claiming):
                self._finalize(results, stats, bound)
                results = []
            if idle:
                if not claiming:
                    break
                if not any(rt.capacity(time.monotonic(), self.conf) for rt in runtimes.values()):
                    # Waiting for the other lanes to scale down is part of this tick's work, if the
                    # held channels have anything to send; a pause or an open circuit is left to a
                    # later tick.
                    held = [cid for cid, rt in runtimes.items() if rt.held]
                    if held and held_have_due is None:
                        held_have_due = lane_shares.has_due_rows(held, self.clock.now(), self.lane_priorities)
                    if not held or not held_have_due:
                        break  # every channel is exhausted, paused or open-circuited for now
                    time.sleep(lane_shares.JOIN_POLL_SECONDS / 4)
            elif not calls and queued:
                time.sleep(min(0.05, self._wait_time(runtimes)))

    def _dispatch(self, runtimes: dict[int, ChannelRuntime], results: list[Outcome], bound: Any) -> None:
        """Start what may start now: inline providers run right here, others on the send loop."""
        flight = self._flight
        for rt in runtimes.values():
            if rt.inline:
                while rt.queue and rt.can_start(time.monotonic()):
                    results.append(self._send_inline(rt, rt.queue.popleft(), results, bound))
                continue
            started: list[ClaimedRecord] = []
            with flight.lock:
                while rt.queue and rt.can_start(time.monotonic()):
                    record = rt.queue.popleft()
                    flight.start(rt)
                    rt.inflight += 1
                    started.append(record)
            if started:
                self._loop().spawn(self._slot(rt, record) for record in started)

    def _send_inline(
        self, rt: ChannelRuntime, record: ClaimedRecord, results: list[Outcome], bound: Any
    ) -> Outcome:
        """Send on this thread (an inline provider) and feed the outcome to the channel's flow control."""
        rt.begin(time.monotonic())
        outcome = self._send(rt, record)
        self._account(rt, outcome, results, bound)
        return outcome

    async def _slot(self, rt: ChannelRuntime, record: ClaimedRecord) -> None:
        """One concurrency slot of a channel: send, then keep it busy with the next queued record."""
        flight = self._flight
        while True:
            outcome = await self._send_async(rt, record)
            with flight.lock:
                flight.finish(rt, outcome)
                # Chain only after a success: a failure goes through the worker's flow control first
                # (throttling pauses the channel, the circuit breaker may open).
                if (
                    outcome.result == SENT
                    and not self.stopping
                    and rt.queue
                    and rt.can_start(time.monotonic())
                ):
                    record = rt.queue.popleft()
                    flight.start(rt)
                    continue
                rt.inflight -= 1
                return

    @staticmethod
    def _completed(
        done: queue.SimpleQueue[tuple[ChannelRuntime, Outcome]], timeout: float, batch_delay: float = 0.0
    ) -> list[tuple[ChannelRuntime, Outcome]]:
        """Calls finished so far, waiting up to ``timeout`` for the first one, then ``batch_delay`` more."""
        try:
            finished = [done.get(timeout=timeout) if timeout > 0 else done.get_nowait()]
        except queue.Empty:
            return []
        if timeout > 0 and batch_delay > 0:
            time.sleep(batch_delay)
        while True:
            try:
                finished.append(done.get_nowait())
            except queue.Empty:
                return finished

    def _claim(
        self,
        plan: list[ChannelClaim],
        remaining: int,
        runtimes: dict[int, ChannelRuntime],
        stats: TickStats,
        results: list[Outcome],
        bound: Any,
    ) -> None:
        budgets = {cid: (rt.config.max_attempts, rt.config.key) for cid, rt in runtimes.items()}

        def settle(record: ClaimedRecord) -> Outcome | None:
            # Providers without I/O deliver inside the claim: one row write instead of lease + finalize.
            rt = runtimes[record.channel_id]
            if not rt.inline:
                return None
            if time.monotonic() < rt.paused_until:
                return self._deferred(rt, record, time.monotonic())
            if rt.queue or not rt.can_start(time.monotonic()):
                return None
            return self._send_inline(rt, record, results, bound)

        batch = claim_due(
            self.clock.now(),
            plan,
            total=remaining,
            budgets=budgets,
            attempts_by_type=self.conf.ATTEMPTS_BY_TYPE,
            priorities=self.lane_priorities,
            settle=settle,
        )
        got: dict[int, int] = {}
        for record in batch.records:
            runtimes[record.channel_id].queue.append(record)
            got[record.channel_id] = got.get(record.channel_id, 0) + 1
        stats.claims += len(batch.records) + len(batch.settled)
        # Settled-in-claim rows were committed with the claim: account for them now.
        for outcome in batch.settled:
            rt = runtimes[outcome.record.channel_id]
            got[rt.config.pk] = got.get(rt.config.pk, 0) + 1
            self._record_final(outcome, rt, stats, bound)
        if not batch.more and len(batch.records) + len(batch.settled) < remaining:
            for p in plan:
                if got.get(p.channel_id, 0) < p.limit:
                    runtimes[p.channel_id].exhausted = True

    def _deferred(self, rt: ChannelRuntime, record: ClaimedRecord, now_mono: float) -> Outcome:
        """A claimed record of a throttled channel, rescheduled unsent for when the pause ends."""
        return self._failure(
            rt,
            record,
            True,
            "throttled",
            "channel throttled by the provider; not sent",
            max(0.0, rt.paused_until - now_mono),
            now_mono,
        )

    def _release_queued(self, runtimes: dict[int, ChannelRuntime], bound: Any) -> None:
        """On a stop, give back claimed records not started yet: only the calls in flight are finished."""
        with self._flight.lock:
            queued = [record for rt in runtimes.values() for record in rt.queue]
            for rt in runtimes.values():
                rt.queue.clear()
        released = release(queued)
        bound.info("records-released", count=released, reason="stop requested before they were sent")

    def _record_span(self, rt: ChannelRuntime, record: ClaimedRecord) -> Any:
        """A record's span, parented to the tick's span even from the send loop's thread."""
        if not self._tracing:
            return tracing.NO_SPAN
        return tracing.span(
            "notifications_retry.record",
            parent=self._trace_parent,
            **{
                "job_run_id": self._run_id,
                "notification.id": str(record.id),
                "notification.channel": rt.config.key,
                "notification.attempt": record.attempts,
                "tenant.id": record.tenant_id,
                "correlation_id": record.correlation_id or None,
            },
        )

    def _provider_span(self, rt: ChannelRuntime, record: ClaimedRecord) -> Any:
        if not self._tracing:
            return tracing.NO_SPAN
        return tracing.span(
            "notifications_retry.provider.send",
            **{
                "notification.id": str(record.id),
                "notification.channel": rt.config.key,
                "notification.attempt": record.attempts,
                "correlation_id": record.correlation_id or None,
                "provider.key": rt.config.provider_key,
                "job_run_id": self._run_id,
            },
        )

    @staticmethod
    def _end_span(span: Any, outcome: Outcome) -> Outcome:
        if span is None:
            return outcome
        tracing.set_attributes(
            span,
            **{"notification.outcome": outcome.result, "notification.error_kind": outcome.error_kind or None},
        )
        return outcome

    def _message(
        self, rt: ChannelRuntime, record: ClaimedRecord, started: float
    ) -> OutgoingMessage | Outcome:
        """What to send for ``record``, or its outcome when nothing can be sent."""
        if not isinstance(record.recipient, str) or not record.recipient.strip():
            # No provider can deliver to nobody: a permanent failure, without a call.
            return self._failure(
                rt,
                record,
                False,
                "invalid_recipient",
                f"recipient {record.recipient!r} is empty",
                None,
                started,
            )
        return OutgoingMessage(
            notification_id=record.id,
            tenant_id=record.tenant_id,
            channel=rt.config.key,
            recipient=record.recipient,
            payload=record.payload,
            attempt=record.attempts,
            priority=record.priority,
            notification_type=record.notification_type,
        )

    def _sent(self, record: ClaimedRecord, result: SendResult, started: float) -> Outcome:
        return Outcome(
            record,
            SENT,
            provider_message_id=result.provider_message_id,
            duration_ms=(time.monotonic() - started) * 1000,
        )

    def _raised(self, rt: ChannelRuntime, record: ClaimedRecord, exc: Exception, started: float) -> Outcome:
        """Classify what a provider call raised (SPEC §5): its error's kind, else a retriable crash."""
        if isinstance(exc, ProviderError):
            return self._failure(rt, record, exc.retriable, exc.kind, str(exc), exc.retry_after, started)
        return self._failure(
            rt, record, True, "provider_crash", f"{type(exc).__name__}: {exc}", None, started
        )

    def _send(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        """Send one record on this thread (an inline provider), in its own span."""
        started = time.monotonic()
        with self._record_span(rt, record) as span:
            message = self._message(rt, record, started)
            if isinstance(message, Outcome):
                return self._end_span(span, message)
            try:
                with self._provider_span(rt, record):
                    result = rt.provider.send(message)
            except Exception as exc:
                return self._end_span(span, self._raised(rt, record, exc, started))
            return self._end_span(span, self._sent(record, result, started))

    async def _send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        """Send one record on the send loop: awaited if the provider is asynchronous, else on a thread.

        A call that outlives its channel's timeout (plus a grace period) is abandoned as a timeout;
        a synchronous provider's thread is left to finish on its own.
        """
        started = time.monotonic()
        with self._record_span(rt, record) as span:
            message = self._message(rt, record, started)
            if isinstance(message, Outcome):
                return self._end_span(span, message)
            provider = rt.provider
            # A provider that bounds its own calls by the channel's timeout needs no timer of ours:
            # one per call cost 8 % of the send loop's CPU (measured on the webhook).
            watchdog = (
                None
                if provider.supports_async and provider.enforces_timeout
                else asyncio.timeout(float(rt.config.timeout_seconds) + ABANDON_GRACE_SECONDS)
            )
            try:
                with self._provider_span(rt, record):
                    if watchdog is None:
                        result = await provider.send_async(message)
                    else:
                        async with watchdog:
                            result = await self._call(provider, message)
            except Exception as exc:
                if watchdog is not None and watchdog.expired():
                    timeout = f"provider did not return within {rt.config.timeout_seconds:g}s"
                    outcome = self._failure(rt, record, True, "timeout", timeout, None, started)
                else:
                    outcome = self._raised(rt, record, exc, started)
                return self._end_span(span, outcome)
            return self._end_span(span, self._sent(record, result, started))

    async def _call(self, provider: Provider, message: OutgoingMessage) -> SendResult:
        """Await an asynchronous provider; run a synchronous one on the thread pool."""
        if provider.supports_async:
            return await provider.send_async(message)
        return await asyncio.get_running_loop().run_in_executor(self._executor(), provider.send, message)

    def _failure(
        self,
        rt: ChannelRuntime,
        record: ClaimedRecord,
        retriable: bool,
        kind: str,
        error: str,
        retry_after: float | None,
        started: float,
    ) -> Outcome:
        duration = (time.monotonic() - started) * 1000
        budget = attempt_budget(
            rt.config.max_attempts, rt.config.key, record.notification_type, self.conf.ATTEMPTS_BY_TYPE
        )
        if not retriable or record.attempts >= budget:
            return Outcome(
                record,
                TERMINAL,
                error_kind=kind,
                error=error,
                duration_ms=duration,
                retry_after=retry_after,
                retriable=retriable,
            )
        when = next_attempt_at(record.attempts, self.clock.now(), self.rng, rt.policy, retry_after)
        return Outcome(
            record,
            RETRY,
            error_kind=kind,
            error=error,
            next_attempt_at=when,
            duration_ms=duration,
            retry_after=retry_after,
            retriable=True,
        )

    def _account(self, rt: ChannelRuntime, outcome: Outcome, results: list[Outcome], bound: Any) -> None:
        """Feed the outcome to the channel's flow control (throttling pauses, circuit breaker)."""
        now_mono = time.monotonic()
        if outcome.result == SENT:
            changed = rt.breaker.success()
        elif outcome.error_kind == "throttled" or (outcome.retriable and outcome.retry_after):
            pause = outcome.retry_after or self.conf.THROTTLE_DEFAULT_SECONDS
            rt.paused_until = max(rt.paused_until, now_mono + pause)
            changed = None
            rt.breaker.neutral()
            bound.warning(
                "channel-throttled", channel=rt.config.key, pause_s=round(pause, 3), deferred=len(rt.queue)
            )
            # The provider asked the whole channel to wait: records already claimed for it are not sent
            # before Retry-After; they are rescheduled like the throttled one (the attempt stays counted).
            with self._flight.lock:
                queued = list(rt.queue)
                rt.queue.clear()
            results.extend(self._deferred(rt, record, now_mono) for record in queued)
        elif outcome.retriable:
            changed = rt.breaker.failure(now_mono)
        else:
            rt.breaker.neutral()
            changed = None
        if changed == rt.breaker.OPEN and rt.queue:
            # Records claimed but not started keep their attempt budget through the cool-down: give them
            # back (attempts restored, lease cleared) instead of sending them into an outage.
            with self._flight.lock:  # sender threads pop from this queue too
                queued = list(rt.queue)
                rt.queue.clear()
            bound.info(
                "records-released",
                channel=rt.config.key,
                count=release(queued),
                reason="circuit opened before they were sent",
            )

    def _wait_time(self, runtimes: dict[int, ChannelRuntime]) -> float:
        now_mono = time.monotonic()
        waits = [rt.limiter.wait_time(now_mono) for rt in runtimes.values() if rt.queue]
        return max(0.001, min([0.05, *[w for w in waits if w > 0]]))

    def _finalize(self, results: list[Outcome], stats: TickStats, bound: Any) -> None:
        report = finalize(results, self.clock.now())
        stats.stale += len(report.stale)
        stats.finalize_failed += len(report.failed)
        for outcome in report.applied:
            rt = self._runtimes[outcome.record.channel_id]
            self._record_final(outcome, rt, stats, bound)
        for outcome in report.stale:
            bound.warning(
                "item-stale",
                notification_id=str(outcome.record.id),
                reason="claim expired or taken over; outcome discarded",
            )

    def _record_final(self, outcome: Outcome, rt: ChannelRuntime, stats: TickStats, bound: Any) -> None:
        """Count, log and alert one committed outcome."""
        channel = rt.config.key
        record = outcome.record
        stats.processed += 1
        context = dict(
            notification_id=str(record.id),
            channel=channel,
            tenant_id=str(record.tenant_id) if record.tenant_id else None,
            attempt=record.attempts,
            duration_ms=round(outcome.duration_ms, 1),
            correlation_id=record.correlation_id or None,
        )
        metrics.PROCESSED.labels(channel, outcome.result).inc()
        if outcome.result == SENT:
            stats.sent += 1
            metrics.SENT.labels(channel).inc()
            bound.info("item-sent", outcome="sent", **context)
        elif outcome.result == RETRY:
            stats.retried += 1
            metrics.RETRIED.labels(channel, outcome.error_kind).inc()
            bound.info(
                "item-retried",
                outcome="retry",
                error_kind=outcome.error_kind,
                next_attempt_at=outcome.next_attempt_at.isoformat() if outcome.next_attempt_at else None,
                **context,
            )
        else:
            stats.terminal += 1
            metrics.TERMINAL_FAILED.labels(channel, outcome.error_kind).inc()
            bound.error(
                "item-failed-terminal",
                outcome="terminal",
                error_kind=outcome.error_kind,
                error=redact(outcome.error, record.recipient, record.payload)[:300],
                **context,
            )
            terminal_failure.send(
                sender=Worker,
                notification_id=record.id,
                channel=channel,
                error_kind=outcome.error_kind,
                error=outcome.error,
                attempts=record.attempts,
            )

    # -- channels ------------------------------------------------------------------------------

    def _load_channels(self, stats: TickStats, bound: Any) -> dict[int, ChannelRuntime]:
        """Usable channels of this lane; report disabled or broken channels that have due rows."""
        configs = list(ChannelConfig.objects.all())
        if self.lane_channels is not None:
            configs = [c for c in configs if c.key in self.lane_channels]
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
        for pk in set(self._runtimes) - set(usable):
            self._runtimes.pop(pk).provider.close()
            self._fingerprints.pop(pk, None)
        if unusable:
            self._report_unusable(unusable, stats, bound)
        return usable

    def _runtime(self, config: ChannelConfig) -> ChannelRuntime:
        fingerprint = channel_fingerprint(config)
        runtime = self._runtimes.get(config.pk)
        if runtime is None or self._fingerprints.get(config.pk) != fingerprint:
            if runtime is not None:
                runtime.provider.close()
            provider = get_provider_class(config.provider_key)(config.settings())
            runtime = ChannelRuntime(config, provider, self.conf)
            # A new breaker starts closed; publishing it makes "circuit open" alerts resolvable.
            metrics.CIRCUIT_STATE.labels(config.key).set(metrics.CIRCUIT_STATE_VALUES["closed"])
            self._runtimes[config.pk] = runtime
            self._fingerprints[config.pk] = fingerprint
        runtime.config = config
        runtime.exhausted = False
        runtime.queue.clear()
        runtime.inflight = 0
        return runtime

    def _report_unusable(
        self, unusable: dict[int, tuple[ChannelConfig, str]], stats: TickStats, bound: Any
    ) -> None:
        now = self.clock.now()
        counts = (
            NotificationEntity.objects.due(now)
            .filter(channel_id__in=list(unusable))
            .values_list("channel_id")
            .order_by()
            .annotate(count=Count("pk"))
        )
        for cid, count in counts:
            config, reason = unusable[cid]
            stats.channel_disabled += count
            metrics.CHANNEL_DISABLED.labels(config.key).inc(count)
            bound.warning("channel-disabled", channel=config.key, due_waiting=count, reason=reason)

    def _loop(self) -> SendLoop:
        if self._send_loop is None:
            self._send_loop = SendLoop()
        return self._send_loop

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self.conf.WORKER_THREADS, thread_name_prefix="notifications-retry-send"
            )
        return self._pool

    # -- channel limits shared with other lanes ----------------------------------------------

    def _leave_board(self) -> None:
        try:
            self._board.leave()
        except (DatabaseError, InterfaceError) as exc:
            log.warning("lane-shares-update-failed", lane=self.lane, error=repr(exc))

    # -- bookkeeping ---------------------------------------------------------------------------

    def _heartbeat(
        self,
        *,
        started_at: datetime | None = None,
        completed_at: datetime | None = None,
        tick_stats: dict[str, Any] | None = None,
    ) -> None:
        values: dict[str, Any] = {"hostname": socket.gethostname()[:255], "pid": os.getpid()}
        if started_at is not None:
            values["last_tick_started_at"] = started_at
        if completed_at is not None:
            values["last_tick_completed_at"] = completed_at
            values["last_tick_stats"] = tick_stats or {}
        WorkerHeartbeat.objects.update_or_create(lane=self.lane, defaults=values)

    def _after_tick(self, stats: TickStats, bound: Any) -> None:
        from notifications_retry.models import BacklogSample
        from notifications_retry.observability.health import backlog

        try:
            now = self.clock.now()
            current = backlog(now)
            metrics.FAILED_BACKLOG.set(current.failed_backlog)
            metrics.DUE_BACKLOG.set(current.due)
            metrics.OLDEST_DUE_AGE.set(current.oldest_due_age_seconds)
            metrics.LAST_TICK_COMPLETED.labels(self.lane).set(time.time())
            BacklogSample.objects.create(
                taken_at=now,
                due_backlog=current.due,
                failed_backlog=current.failed_backlog,
                dead_letters_unresolved=current.dead_letters_unresolved,
                oldest_due_age_seconds=current.oldest_due_age_seconds,
            )
            self._heartbeat(completed_at=now, tick_stats=stats.as_dict())
        except DatabaseError as exc:
            bound.warning("tick-bookkeeping-failed", error=repr(exc))
        bound.info(
            "cycle-completed",
            processed=stats.processed,
            sent=stats.sent,
            retried=stats.retried,
            terminal=stats.terminal,
            stale=stats.stale,
            channel_disabled=stats.channel_disabled,
            duration_ms=round(stats.duration_ms, 1),
            stopped=stats.stopped,
            deadline_reached=stats.deadline_reached,
            lock_lost=stats.lock_lost,
        )


def _drop_broken_connection() -> None:
    """Reconnect after a lost connection (server restart, terminated backend) instead of failing forever.

    Unlike ``close_old_connections`` this keeps a healthy connection, whatever ``CONN_MAX_AGE`` says:
    a long-running worker has no request cycle to bound a connection's life.
    """
    if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
        connection.close()


def run_worker(
    *,
    once: bool,
    batch_size: int | None = None,
    max_duration: float | None = None,
    interval: float | None = None,
    lane: str | None = None,
    install_signals: bool = True,
) -> Sequence[TickStats]:
    """What the management command calls."""
    worker = Worker(batch_size=batch_size, max_duration=max_duration, interval=interval, lane=lane)
    if install_signals:
        worker.install_signal_handlers()
    return worker.run(once=once)


__all__ = ["TickStats", "Worker", "run_worker"]
