"""The retry worker: runs ticks under an advisory lock, stops gracefully, keeps its heartbeat.

Plain Python: the management command only parses options and runs one. Tests call :class:`Worker`
directly with an injected clock (wall time for due decisions), ``monotonic`` (pacing and deadlines) and
``rng`` (backoff jitter). Its parts are wired together from the settings and its options
(:class:`WorkerOptions`) by :func:`build_parts`; the worker runs them. What a tick does is the
:class:`~.dispatcher.Dispatcher`'s; how one record is sent is the :class:`~.executor.Executor`'s; how
outcomes are committed is the :class:`~.completer.Completer`'s; which lock a worker ticks under,
:func:`~notifications_retry.database.locks.lane_lock`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

import psycopg
import structlog
from django.db import DatabaseError, InterfaceError, connection
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import DEFAULT_LANE, RetrySettings, get_settings, lane_channels
from notifications_retry.database.locks import AdvisoryLock, PartitionLock, lane_lock
from notifications_retry.delivery.session import drop_broken_connection
from notifications_retry.engine import failures
from notifications_retry.engine.channels import ChannelSet
from notifications_retry.engine.claiming import ClaimConnection
from notifications_retry.engine.completer import Commits, Completer, LoopCompleter, commit_in_hand
from notifications_retry.engine.dispatcher import Dispatcher, chunk_size
from notifications_retry.engine.executor import (
    ABANDON_GRACE_SECONDS,
    Executor,
    abandoned_after,
    calls_bound_seconds,
)
from notifications_retry.engine.flow_control import InFlightCap
from notifications_retry.engine.loop_tasks import LoopTasks
from notifications_retry.engine.reporting import Bookkeeping, OutcomeReporter, TickStats
from notifications_retry.engine.wakeup import LockConnectionPort, Waiter, reopens_at, wake_after
from notifications_retry.observability import metrics, tracing
from notifications_retry.observability.heartbeat_file import HeartbeatFile
from notifications_retry.runtime.asyncio_bridge import SteppedLoop
from notifications_retry.runtime.clock import Clock, default_clock
from notifications_retry.signals import channel_health_changed

log = structlog.get_logger("notifications_retry.worker")

#: After a stop, how long outcomes may wait for an unreachable database before the worker gives up.
STOP_COMMIT_GRACE_SECONDS = 2.0


def stop_budget_seconds(max_timeout: float) -> float:
    """The longest a graceful stop takes in the process, for channels whose largest ``timeout_seconds``
    is ``max_timeout``: the calls in flight end within their timeout and the executor's grace (past it
    a call is abandoned), then the outcomes in hand commit, or are given up on once the database has
    stayed unreachable for ``STOP_COMMIT_GRACE_SECONDS``. docs/operations.md, "Stopping"."""
    return abandoned_after(max_timeout) + STOP_COMMIT_GRACE_SECONDS


@dataclasses.dataclass(frozen=True)
class WorkerOptions:
    """What a worker is told: its command's options, else the settings; :meth:`of` checks them."""

    batch_size: int
    max_duration: float
    interval: float
    max_in_flight: int
    lane: str
    #: The lane's priorities (``LANES[lane]["priorities"]``; None: every priority).
    priorities: list[int] | None
    #: Whether this process serves ``/metrics`` (``retry_worker --metrics-port``, else ``METRICS_PORT``):
    #: only then are the labelled series created at zero, for a scrape to see a first batch.
    serving_metrics: bool = True

    @classmethod
    def of(
        cls,
        conf: RetrySettings,
        *,
        batch_size: int | None = None,
        max_duration: float | None = None,
        interval: float | None = None,
        lane: str | None = None,
        max_in_flight: int | None = None,
        serving_metrics: bool = True,
    ) -> WorkerOptions:
        """The options given, the settings for those not given; a ValueError names a bad one."""
        batch_size = batch_size if batch_size is not None else conf.BATCH_SIZE
        max_duration = max_duration if max_duration is not None else conf.MAX_DURATION_SECONDS
        interval = interval if interval is not None else conf.INTERVAL_SECONDS
        max_in_flight = max_in_flight if max_in_flight is not None else conf.WORKER_MAX_IN_FLIGHT
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        if max_duration <= 0:
            raise ValueError(f"max duration must be > 0, got {max_duration}")
        if interval < 0:
            raise ValueError(f"interval must be >= 0, got {interval}")
        if max_in_flight < 1:
            raise ValueError(f"max in flight must be >= 1, got {max_in_flight}")
        lane_conf: Mapping[str, Any] = {}
        if lane and lane != DEFAULT_LANE:
            if lane not in conf.LANES:
                raise ValueError(f"unknown lane {lane!r}; configured lanes: {sorted(conf.LANES) or 'none'}")
            lane_conf = conf.LANES[lane]
        priorities = list(lane_conf.get("priorities") or []) or None
        return cls(
            batch_size,
            max_duration,
            interval,
            max_in_flight,
            lane or DEFAULT_LANE,
            priorities,
            serving_metrics,
        )


@dataclasses.dataclass
class WorkerParts:
    """What a worker is made of, wired together by :func:`build_parts`."""

    lock: AdvisoryLock
    bookkeeping: Bookkeeping
    channels: ChannelSet
    tasks: LoopTasks
    #: Builds the wait between a loop's ticks (engine.wakeup); :attr:`waiter` is the one it built.
    new_waiter: Callable[[], Waiter]
    #: The loop the sends run on, run by the worker's own thread whenever the tick waits.
    send_loop: SteppedLoop
    #: Each channel's key by id, for the tick under way (the reporter's labels).
    keys: dict[int, str]
    reporter: OutcomeReporter
    executor: Executor
    completer: Commits
    #: The send loop's connection, where the claims and the commits take turns (None inside a test's
    #: transaction, whose rows no other connection can see: then every statement is Django's).
    claim_connection: ClaimConnection | None
    #: The claim beside it on a backlog of inline rows, opened when one comes, closed at its tick's end.
    beside_connection: ClaimConnection | None
    dispatcher: Dispatcher

    @functools.cached_property
    def waiter(self) -> Waiter:
        """The wait between ticks, built when a loop first waits: a single tick (``--once``) waits for
        none, and builds none."""
        return self.new_waiter()


def build_parts(
    conf: RetrySettings,
    options: WorkerOptions,
    *,
    clock: Clock,
    rng: random.Random,
    monotonic: Callable[[], float],
    stopping: Callable[[], bool],
    pause: Callable[[float], object],
) -> WorkerParts:
    """A worker's parts from the settings and its options. ``stopping`` says whether a stop was asked;
    ``pause`` waits between a failed wait's reconnects (the stop event's wait, so a stop cuts it short).
    The clock, ``monotonic`` and ``rng`` are the worker's: tests give theirs."""
    lane = options.lane
    lock = lane_lock(conf, lane, rng)
    served = lane_channels(conf.LANES, lane)
    cap = InFlightCap(options.max_in_flight)
    channels = ChannelSet(conf, conf.LANES, lane, served, cap=cap, serving_metrics=options.serving_metrics)
    #: What the loop runs besides ticks (the relay, housekeeping, the outbox gauges: the command adds
    #: them, engine.loop_tasks): after each tick, and in slices of the wait between ticks.
    tasks = LoopTasks(monotonic=monotonic, stopping=stopping)

    def new_waiter() -> Waiter:
        return Waiter(
            tasks.around(
                LockConnectionPort(
                    lock,
                    channels=served,
                    priorities=options.priorities,
                    # Built at the loop's first wait, once the command added its tasks: a relaying
                    # worker's poll looks at the outbox for its relay, in the same statement.
                    on_outbox=tasks.outbox_seen if tasks.watch_outbox else None,
                )
            ),
            clock=clock,
            monotonic=monotonic,
            stopping=stopping,
            sleep=pause,
            log=log.bind(lane=lane),
        )

    send_loop = SteppedLoop()
    keys: dict[int, str] = {}
    reporter = OutcomeReporter(keys)
    executor = Executor(
        clock=clock,
        rng=rng,
        monotonic=monotonic,
        attempts_by_type=conf.ATTEMPTS_BY_TYPE,
        # A synchronous provider's call holds a thread while in flight, and the cap already bounds
        # the calls in flight (each channel's max_concurrency its own): a thread for each place.
        # The pool starts a thread only when no idle one is left, so unused places cost nothing.
        threads=options.max_in_flight,
    )
    completer = Completer(
        clock=clock,
        monotonic=monotonic,
        on_report=reporter.report,
        max_batch=chunk_size(options.batch_size),
        slots=cap,
    )
    # Claims and commits run on the send loop's connection, taking turns (delivery.session.LoopConnection),
    # and a second claimer beside them on a backlog of inline rows — unless this thread is inside a
    # transaction (a test's), whose rows no other connection can see.
    beside = not connection.in_atomic_block
    claim_connection = ClaimConnection(send_loop, role="loop") if beside else None
    commits: Commits = (
        LoopCompleter(completer, send_loop, connection=claim_connection) if claim_connection else completer
    )
    beside_connection = ClaimConnection(send_loop, role="claims-beside") if beside else None
    dispatcher = Dispatcher(
        conf=conf,
        executor=executor,
        completer=commits,
        reporter=reporter,
        send_loop=lambda: send_loop,
        monotonic=monotonic,
        stopping=stopping,
        lane_priorities=options.priorities,
        claim_connection=claim_connection,
        beside_connection=beside_connection,
        cap=cap,
    )
    return WorkerParts(
        lock=lock,
        bookkeeping=Bookkeeping(lane, clock, monotonic),
        channels=channels,
        tasks=tasks,
        new_waiter=new_waiter,
        send_loop=send_loop,
        keys=keys,
        reporter=reporter,
        executor=executor,
        completer=commits,
        claim_connection=claim_connection,
        beside_connection=beside_connection,
        dispatcher=dispatcher,
    )


class Worker:
    """Runs ticks: single owner by advisory lock, claim → call → commit, graceful stop."""

    def __init__(
        self,
        *,
        batch_size: int | None = None,
        max_duration: float | None = None,
        interval: float | None = None,
        lane: str | None = None,
        max_in_flight: int | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        heartbeat_file: str | None = None,
        wall: Callable[[], float] = time.time,
        serving_metrics: bool = True,
    ) -> None:
        self.conf = conf = get_settings()
        self.options = options = WorkerOptions.of(
            conf,
            batch_size=batch_size,
            max_duration=max_duration,
            interval=interval,
            lane=lane,
            max_in_flight=max_in_flight,
            serving_metrics=serving_metrics,
        )
        self.batch_size, self.max_duration = options.batch_size, options.max_duration
        self.interval, self.max_in_flight, self.lane = options.interval, options.max_in_flight, options.lane
        self.clock = clock or default_clock(conf.CLOCK)
        self.rng = rng or random.Random()
        self.monotonic = monotonic
        self.wall = wall
        self._sleep = sleep
        #: This process's own heartbeat on disk, for a pod's liveness probe (observability.heartbeat_file).
        self.heartbeat = HeartbeatFile(heartbeat_file, lane=self.lane) if heartbeat_file else None
        self._stop = threading.Event()
        #: The pause from one tick's start to the next, built at a loop's first pause (``--once`` has none).
        self._backoff: failures.Backoff | None = None
        self._stop_at: float | None = None
        #: The signal that asked for a stop, until the worker's thread says so (``stop-requested``).
        self._signalled: str | None = None
        #: The stop budget last logged (``stop-budget``: at the first tick, and when channels change it).
        self._stop_budget: float | None = None
        # A looping worker keeps outcomes through an outage of any length (the claim token refuses a
        # late one whose row was taken over); a single tick gives up on those whose lease ran out.
        self._looping = False
        parts = build_parts(
            conf,
            options,
            clock=self.clock,
            rng=self.rng,
            monotonic=monotonic,
            stopping=self._stopping,
            # A failed wait pauses on the stop event before it reconnects: a stop cuts the pause short.
            pause=self._stop.wait,
        )
        self.lock, self.bookkeeping, self.channels = parts.lock, parts.bookkeeping, parts.channels
        self._parts = parts
        self.tasks, self._send_loop = parts.tasks, parts.send_loop
        self._keys, self.reporter, self.executor = parts.keys, parts.reporter, parts.executor
        self.completer, self.dispatcher = parts.completer, parts.dispatcher
        self.claim_connection, self.beside_connection = parts.claim_connection, parts.beside_connection
        # Endpoint health changes are counted in this process's metrics (delivery/health.py signals them).
        channel_health_changed.connect(metrics.count_health_change, dispatch_uid="nr-health-metric")
        if options.serving_metrics:
            metrics.precreate_series([], [], [self.lane])
        self.channels.precreate_series()  # every channel's counters at 0 before the first tick's scrape

    @property
    def waiter(self) -> Waiter:
        """The wait between a loop's ticks (engine.wakeup), built at its first use."""
        return self._parts.waiter

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self, *_: Any) -> None:
        """Ask for a graceful stop: no new claims; records in hand are finished and committed."""
        if not self._stop.is_set():
            self._stop_at = self.monotonic()
        self._stop.set()
        self.tasks.stop()

    @property
    def stopping(self) -> bool:
        return self._stopping()

    def _stopping(self) -> bool:
        """Whether a stop was asked; the first look after a signal says so (``stop-requested``)."""
        if self._signalled is not None:
            name, self._signalled = self._signalled, None
            log.info("stop-requested", signal=name, lane=self.lane)
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker at the next record boundary."""

        def handler(signum: int, frame: FrameType | None) -> None:
            # No log line here: the handler runs on the worker's thread between two of its steps, maybe
            # inside the write of a log line, whose lock (structlog's PrintLogger holds one) it would wait
            # for forever. The next look at the stop flag says it (_stopping).
            self._signalled = signal.Signals(signum).name
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, once: bool = False) -> list[TickStats]:
        """Tick once, or until stopped: as soon as a row falls due, and at least every ``interval``
        seconds; returns the ticks' stats."""
        ticks: list[TickStats] = []
        self._looping = not once
        try:
            while True:
                started = self.monotonic()
                self._beat()
                ticks.append(self.tick())
                self._beat()
                if not self.stopping:
                    if ticks[-1].processed:
                        self.tasks.nudge("relay")  # the tick's outcomes wrote events: publish them now
                    self.tasks.run_due()
                if once or self.stopping:
                    break
                # A tick never overlaps the next. After a failed tick the pause grows (capped), so a
                # database outage is not hammered; after one that ran, the next starts when a row
                # falls due (engine.wakeup), at the latest when the interval ends.
                until = self._next_start(started, ticks[-1])
                if (
                    ticks[-1].error
                    or self._sleep is not None
                    or not self._wait_for_work(ticks[-1], started, until)
                ):
                    remaining = until - self.monotonic()
                    if remaining > 0:
                        if self._sleep is not None:
                            self._sleep(remaining)
                        elif self._stop.wait(remaining):
                            break
                if len(ticks) > 1000:
                    ticks = ticks[-1000:]
        finally:
            self._stopping()  # a signal's stop is said, if no look at the flag said it yet
            self.close()
            if self._stop_at is not None:
                # How long the stop took in this process (calls finished or abandoned, rows given back,
                # lock released, threads closed): the bound docs/operations.md gives. The interpreter's
                # own exit comes after, and takes what CPU the machine leaves it.
                log.info("worker-stopped", after_stop_s=round(self.monotonic() - self._stop_at, 3))
        return ticks

    def _next_start(self, started: float, last: TickStats) -> float:
        """When a loop's next tick starts, the last one having started at ``started``: the interval
        after it, or after failed ticks the backoff (engine.failures)."""
        if self._backoff is None:
            self._backoff = failures.Backoff(self.interval)
        return started + self._backoff.pause(bool(last.error))

    def _wait_for_work(self, last: TickStats, started: float, until: float) -> bool:
        """Wait until a row falls due or ``until``; False when the database clock could not be read (the
        caller then waits out the interval). A wait whose connection fails reconnects and goes on
        (engine.wakeup). ``started``: when the last tick began (monotonic)."""
        # A tick that ended on its own took every due row it could; the rows due before it began that
        # are still due are ones it could not take (channel paused, circuit open, poison, another
        # worker's lock): only rows falling due since wake the worker (engine.wakeup.wake_after), or a
        # paused channel reopening.
        try:
            # The tick's start on the clock due times are read with (a database clock syncs once).
            now = self.clock.now()
        except DatabaseError:
            return False
        after = wake_after(last, batch_size=self.batch_size, now=now, elapsed=self.monotonic() - started)
        pauses = [rt.blocked_until() for rt in self.channels.runtimes.values()]
        until = min(until, reopens_at(pauses, self.monotonic()))
        partitioned = self.lock if isinstance(self.lock, PartitionLock) else None
        beat = (lambda: self._beat(when_due=True)) if self.heartbeat is not None else None
        self.waiter.wait_for_work(until=until, after=after, partitions=partitioned, beat=beat)
        return True

    def close(self) -> None:
        """Release the lock, the providers', the commits' and the claims' connections, the send loop and
        the thread pool; first the loop's tasks (the relay marks its batch in flight)."""
        self.tasks.close()
        self.lock.close()
        self.completer.close()
        self.channels.close()
        for claims in (self.claim_connection, self.beside_connection):
            if claims is not None:
                with contextlib.suppress(psycopg.Error):
                    claims.close()
        self._send_loop.close()
        self.executor.close()

    # -- one tick ------------------------------------------------------------------------------

    def tick(self) -> TickStats:
        """One cycle: take the lock or skip; claim, send and commit until done, the batch is full,
        the max duration has passed, or a stop was asked for."""
        stats = TickStats(run_id=uuid.uuid4().hex, lane=self.lane)
        started = self.monotonic()
        bound = log.bind(job_run_id=stats.run_id, lane=self.lane)
        self.reporter.begin_tick(stats, bound)
        self.completer.bound = bound
        try:
            drop_broken_connection()
            # Outcomes a database outage left in hand go first: their leases are running out.
            self._commit_waiting(bound)
            if not self.lock.acquire():
                if self.lock.last_error is not None:
                    raise self.lock.last_error  # the database could not be asked: not "held"
                stats.skipped, stats.skip_reason = True, failures.LOCK_HELD
                bound.info("retry-cycle-skipped", reason=stats.skip_reason)
                return stats
            metrics.LOCK_HELD.labels(self.lane).set(1)
            metrics.LAST_TICK_STARTED.labels(self.lane).set(time.time())
            try:
                self._cycle(stats, started, bound)
            finally:
                self.lock.release()
                metrics.LOCK_HELD.labels(self.lane).set(0)
        except (DatabaseError, InterfaceError, psycopg.Error) as exc:
            failure = failures.classify(exc, self.lock.using if exc is self.lock.last_error else "default")
            if failure is None:
                raise
            # Unreachable or not migrated: one line; finish the calls in flight and keep their
            # outcomes for when the database is back; the next statement reconnects.
            stats.error, stats.error_kind = failure.message, failure.kind
            bound.error("retry-cycle-database-error", error=failure.message, kind=failure.kind)
            self._abandon_tick(bound)
            return stats
        stats.duration_ms = (self.monotonic() - started) * 1000
        metrics.CYCLE_DURATION.labels(self.lane).observe(stats.duration_ms)
        metrics.LAST_CYCLE_DURATION.labels(self.lane).set(stats.duration_ms)
        self.bookkeeping.tick_ended(stats, bound, stopping=stats.stopped or self.stopping)
        return stats

    def _cycle(self, stats: TickStats, started: float, bound: FilteringBoundLogger) -> None:
        self.clock.sync()
        lock = self.lock
        if isinstance(lock, PartitionLock):
            stats.partitions = list(lock.owned)
            # A channel's limits are totals over the workers: this tick's part is its partitions' part.
            self.channels.share = len(lock.owned) / lock.partitions
            bound = bound.bind(partitions=stats.partitions, live_workers=lock.live_workers)
        bound.info("retry-cycle-started", batch_size=self.batch_size, max_duration_s=self.max_duration)
        self.bookkeeping.tick_started(self.clock.now())
        runtimes, waiting = self.channels.load(self.clock.now(), bound)
        stats.channel_disabled += sum(waiting.values())
        self._log_stop_budget(runtimes.values(), bound)
        self._keys.clear()
        self._keys.update({cid: rt.key for cid, rt in runtimes.items()})
        with tracing.span("notifications_retry.tick", job_run_id=stats.run_id, lane=self.lane) as span:
            self.executor.begin_tick(stats.run_id)
            try:
                self.dispatcher.run(
                    runtimes,
                    stats,
                    batch_size=self.batch_size,
                    deadline=started + self.max_duration,
                    lock=self.lock,
                    bound=bound,
                )
            finally:
                self.dispatcher.claims.finish(bound)  # a claim still running beside, then its connection
                # Calls still running (an exception left the loop) end within their timeout.
                self.dispatcher.finish_calls(bound, calls_bound_seconds(runtimes.values()))
            self._commit_waiting(bound)
            self.channels.cap.forget_held()  # committed, or given up on a stop: none is waited for now
            tracing.set_attributes(
                span,
                processed=stats.processed,
                sent=stats.sent,
                retried=stats.retried,
                terminal=stats.terminal,
            )

    def _log_stop_budget(self, runtimes: Any, bound: FilteringBoundLogger) -> None:
        """Say how long a graceful stop may take with the channels loaded, when it changes: what a
        process manager must wait before it kills (``terminationGracePeriodSeconds``)."""
        max_timeout = max([float(rt.config.timeout_seconds) for rt in runtimes] or [0.0])
        budget = stop_budget_seconds(max_timeout)
        if budget != self._stop_budget:
            self._stop_budget = budget
            bound.info(
                "stop-budget",
                stop_budget_s=round(budget, 3),
                max_timeout_s=max_timeout,
                formula=f"max(timeout_seconds) + {ABANDON_GRACE_SECONDS:g} s"
                f" + {STOP_COMMIT_GRACE_SECONDS:g} s",
            )

    def _commit_waiting(self, bound: FilteringBoundLogger) -> None:
        """Commit every outcome in hand; while the database is unreachable, retry with backoff.

        A looping worker keeps trying (it has nothing else to do without its database, and the claim
        token makes a late commit safe); ``--once`` or a stopping worker drops what its lease no
        longer covers, so that the process can exit.
        """
        commit_in_hand(
            self.completer,
            bound,
            give_up=self._gave_up_after_stop,
            drop_expired=lambda: not self._looping or self.stopping,
            # A short sleep, not the stop event: once stopping, the event no longer waits at all.
            sleep=self._sleep or time.sleep,
        )
        # Records a database fault kept from going back: unsent, with their attempt, before any claim.
        self.dispatcher.give_back.release_kept(bound)

    def _gave_up_after_stop(self) -> bool:
        """A stop was asked and the database stayed unreachable past the grace period."""
        return (
            self._stop_at is not None
            and self.completer.unavailable
            and self.monotonic() - self._stop_at > STOP_COMMIT_GRACE_SECONDS
        )

    def _abandon_tick(self, bound: FilteringBoundLogger) -> None:
        """After a database error: collect the calls in flight, then try to commit what is in hand."""
        self.dispatcher.finish_calls(bound, calls_bound_seconds(self.channels.runtimes.values()))
        with contextlib.suppress(DatabaseError):
            self.lock.release()
        self.lock.close()
        metrics.LOCK_HELD.labels(self.lane).set(0)
        self._commit_waiting(bound)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _beat(self, *, when_due: bool = False) -> None:
        """Write this process's heartbeat file, if it has one, naming the partitions it owns (with
        ``when_due``, only once the last write is ``BEAT_SECONDS`` old)."""
        if self.heartbeat is not None and not (when_due and not self.heartbeat.due(self.wall())):
            owned = list(self.lock.owned) if isinstance(self.lock, PartitionLock) else None
            self.heartbeat.try_beat(self.wall(), owned, log)


__all__ = ["TickStats", "Worker", "stop_budget_seconds"]
