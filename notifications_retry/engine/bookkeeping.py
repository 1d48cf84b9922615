"""A tick's bookkeeping: the lane's heartbeat row, the backlog's gauges and sample, the cycle's log line.

The backlog's counts read every due row's index entry: after every tick of a large backlog (a tick
ends at ``BATCH_SIZE`` rows) they would cost as much as the tick, once per worker. So they, and the
heartbeat row's completion, are written at most every :data:`BOOKKEEPING_SECONDS` and at a stopping
worker's last tick; the stalled-tick metric and ``cycle-completed``, after every tick.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connection, transaction
from structlog.typing import FilteringBoundLogger

from notifications_retry.delivery.session import bound_transaction
from notifications_retry.engine.reporting import TickStats
from notifications_retry.models import BacklogSample, WorkerHeartbeat
from notifications_retry.observability import metrics
from notifications_retry.observability.health import backlog
from notifications_retry.runtime.clock import Clock

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
            current = backlog(now)
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
        # update_or_create locks the lane's row: bounded like the worker's other transactions, so a
        # partition that strands it cannot hold that lock longer than TRANSACTION_TIMEOUT_SECONDS.
        with transaction.atomic(), connection.cursor() as cursor:
            bound_transaction(cursor)
            WorkerHeartbeat.objects.update_or_create(lane=self.lane, defaults=values)


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
