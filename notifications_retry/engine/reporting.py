"""What a tick did: its stats, the metrics, log events and signal of each committed outcome, and the
tick's bookkeeping after it (:class:`Bookkeeping`, below: the heartbeat row, the backlog's gauges and
sample, ``cycle-completed``)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import structlog
from django.db import DatabaseError, connection, transaction
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import DEFAULT_LANE
from notifications_retry.delivery import FinalizeReport
from notifications_retry.delivery.session import bound_transaction
from notifications_retry.models import BacklogSample, NotificationEntity, WorkerHeartbeat
from notifications_retry.observability import metrics
from notifications_retry.observability.logging import redact
from notifications_retry.rules.outcomes import RETRY, SENT, Outcome
from notifications_retry.runtime.clock import Clock
from notifications_retry.signals import terminal_failure

log = structlog.get_logger("notifications_retry.worker")


@dataclasses.dataclass
class TickStats:
    """What one tick did."""

    run_id: str
    lane: str = DEFAULT_LANE
    skipped: bool = False
    #: Why the tick did not run (``skipped``), in words that are always true.
    skip_reason: str = ""
    #: The database error that ended the tick early, in one line (see engine.failures), and its kind.
    error: str = ""
    error_kind: str = ""
    processed: int = 0
    sent: int = 0
    retried: int = 0
    terminal: int = 0
    stale: int = 0
    finalize_failed: int = 0
    channel_disabled: int = 0
    claims: int = 0
    poisoned: int = 0
    lock_lost: bool = False
    stopped: bool = False
    deadline_reached: bool = False
    #: The tick ended early to take or give back partitions (database.locks).
    rebalanced: bool = False
    #: The partitions the tick owned (PARTITIONS above 1; empty otherwise).
    partitions: list[int] = dataclasses.field(default_factory=list)
    duration_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class OutcomeReporter:
    """Counts, logs and signals committed outcomes into the running tick's stats."""

    def __init__(self, channel_keys: dict[int, str]) -> None:
        self.channel_keys = channel_keys
        self.stats: TickStats | None = None
        self.bound: FilteringBoundLogger = log
        self._children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        #: Told the channels (ids) a commit found disabled: the dispatcher stops calling them.
        self.on_disabled: Callable[[list[int]], None] | None = None

    def begin_tick(self, stats: TickStats, bound: FilteringBoundLogger) -> None:
        self.stats, self.bound = stats, bound
        self._children = {}

    def _counters(self, channel: str, result: str, error_kind: str) -> tuple[Any, Any]:
        """The processed counter and the outcome's own, labelled (looked up once a tick, not per record)."""
        key = (channel, result, error_kind)
        children = self._children.get(key)
        if children is None:
            if result == SENT:
                own = metrics.SENT.labels(channel)
            elif result == RETRY:
                own = metrics.RETRIED.labels(channel, error_kind)
            else:
                own = metrics.TERMINAL_FAILED.labels(channel, error_kind)
            children = self._children[key] = (metrics.PROCESSED.labels(channel, result), own)
        return children

    def report(self, report: FinalizeReport) -> None:
        """What a commit did: applied outcomes are recorded, stale ones logged; channels it found
        disabled are passed on first (no call should start on them while the rest is reported)."""
        if report.disabled and self.on_disabled is not None:
            self.on_disabled(report.disabled)
        stats = self.stats
        if stats is not None:
            stats.stale += len(report.stale)
            stats.finalize_failed += len(report.failed)
        self.record_all(report.applied)
        for outcome in report.stale:
            self.bound.warning(
                "item-stale",
                notification_id=str(outcome.record.id),
                outcome=outcome.result,
                error_kind=outcome.error_kind or None,
                reason="claim expired or taken over; outcome discarded",
            )

    def record_all(self, outcomes: Iterable[Outcome]) -> None:
        """Count, log and alert committed outcomes: each logged, the counters moved once per label set
        (a claim's or a commit's outcomes share a few; a counter's increment takes its lock)."""
        counts: dict[tuple[str, str, str], int] = {}
        try:
            for outcome in outcomes:
                channel = self.channel_keys.get(outcome.record.channel_id, str(outcome.record.channel_id))
                labels = (channel, outcome.result, outcome.error_kind)
                counts[labels] = counts.get(labels, 0) + 1
                self._log(outcome, channel)
        finally:  # a terminal_failure receiver raised: the outcomes up to its own are counted, as logged
            for (channel, result, error_kind), count in counts.items():
                processed, own = self._counters(channel, result, error_kind)
                processed.inc(count)
                own.inc(count)

    def _log(self, outcome: Outcome, channel: str) -> None:
        """Log and alert one committed outcome (of ``channel``, its key) into the tick's stats."""
        record = outcome.record
        stats, bound = self.stats, self.bound
        if outcome.result == SENT and not outcome.delivered_by:
            # The common line, its fields written out (no context dictionary to build and unpack).
            if stats is not None:
                stats.processed += 1
                stats.sent += 1
            bound.info(
                "item-sent",
                outcome="sent",
                notification_id=record.id_text,
                channel=channel,
                tenant_id=record.tenant_text,
                attempt=record.attempts,
                duration_ms=round(outcome.duration_ms, 1),
                correlation_id=record.correlation_id or None,
            )
            return
        context = dict(
            notification_id=record.id_text,
            channel=channel,
            tenant_id=record.tenant_text,
            attempt=record.attempts,
            duration_ms=round(outcome.duration_ms, 1),
            correlation_id=record.correlation_id or None,
        )
        if outcome.delivered_by:
            context["delivered_by"] = outcome.delivered_by
        if stats is not None:
            stats.processed += 1
        if outcome.result == SENT:
            if stats is not None:
                stats.sent += 1
            bound.info("item-sent", outcome="sent", **context)
        elif outcome.result == RETRY:
            if stats is not None:
                stats.retried += 1
            bound.info(
                "item-retried",
                outcome="retry",
                error_kind=outcome.error_kind,
                next_attempt_at=outcome.next_attempt_at.isoformat() if outcome.next_attempt_at else None,
                **context,
            )
        else:
            if stats is not None:
                stats.terminal += 1
            bound.error(
                "item-failed-terminal",
                outcome="terminal",
                error_kind=outcome.error_kind,
                error=redact(outcome.error, record.recipient, record.payload)[:300],
                **context,
            )
            terminal_failure.send(
                sender=OutcomeReporter,
                notification_id=record.id,
                channel=channel,
                error_kind=outcome.error_kind,
                error=outcome.error,
                attempts=record.attempts,
            )


# --------------------------------------------------------------------------------------------------
# A tick's bookkeeping: the lane's heartbeat row, the backlog's gauges and sample, the cycle's log line.
#
# The backlog's counts read every due row's index entry: after every tick of a large backlog (a tick ends at
# ``BATCH_SIZE`` rows) they would cost as much as the tick, once per worker. So they, and the heartbeat
# row's completion, are written at most every :data:`BOOKKEEPING_SECONDS` and at a stopping worker's last
# tick; the stalled-tick metric and ``cycle-completed``, after every tick.
# --------------------------------------------------------------------------------------------------

#: The most often a worker counts the backlog (its gauges and the admin's sample) and writes the lane's
#: heartbeat row, however often its ticks end; a stop's last tick always does.
BOOKKEEPING_SECONDS = 10.0


class Bookkeeping:
    """One worker's bookkeeping for its lane, and when it was last done."""

    def __init__(self, lane: str, clock: Clock, monotonic: Callable[[], float]) -> None:
        self.lane = lane
        self.clock = clock
        self.monotonic = monotonic
        #: When the backlog was last counted and the lane's heartbeat written (monotonic).
        self.booked_at: float | None = None

    def tick_started(self, started_at: datetime) -> None:
        """The lane's heartbeat row says a tick started (the admin's and the liveness check's)."""
        self._heartbeat(started_at=started_at)

    def tick_ended(self, stats: TickStats, bound: FilteringBoundLogger, *, stopping: bool) -> None:
        """After a tick: its metric and log line always, the counts and the heartbeat row when due."""
        try:
            self._book(stats, bound, stopping=stopping)
        finally:
            # Set last, every tick: a scrape that sees the tick completed sees the backlog counted after it.
            metrics.LAST_TICK_COMPLETED.labels(self.lane).set(time.time())

    def _book(self, stats: TickStats, bound: FilteringBoundLogger, *, stopping: bool) -> None:
        now_mono = self.monotonic()
        if self.booked_at is not None and now_mono - self.booked_at < BOOKKEEPING_SECONDS and not stopping:
            log_cycle(stats, bound)
            return
        self.booked_at = now_mono
        try:
            now = self.clock.now()
            current = NotificationEntity.objects.backlog(now)
            metrics.FAILED_BACKLOG.set(current.failed_backlog)
            metrics.DUE_BACKLOG.set(current.due)
            metrics.OLDEST_DUE_AGE.set(current.oldest_due_age_seconds)
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
        log_cycle(stats, bound)

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
        # One upsert (INSERT … ON CONFLICT DO UPDATE) rather than update_or_create's savepoint, locking
        # read and update: twice a tick, three statements fewer each. It locks the lane's row, so it is
        # bounded like the worker's other transactions: a partition that strands it cannot hold that
        # lock longer than TRANSACTION_TIMEOUT_SECONDS.
        with transaction.atomic(), connection.cursor() as cursor:
            bound_transaction(cursor)
            WorkerHeartbeat.objects.bulk_create(
                [WorkerHeartbeat(lane=self.lane, **values)],
                update_conflicts=True,
                unique_fields=["lane"],
                update_fields=list(values),
            )


def log_cycle(stats: TickStats, bound: FilteringBoundLogger) -> None:
    """``cycle-completed``: what the tick did."""
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
        rebalanced=stats.rebalanced,
    )


__all__ = ["BOOKKEEPING_SECONDS", "Bookkeeping", "log_cycle"]
