"""Between a looping worker's ticks: wait until a row falls due, a writer says one did, or the interval ends.

A tick every ``INTERVAL_SECONDS`` sent a row due just after a tick up to a whole interval late. Here
the worker asks the database when its next row falls due and wakes then; a write that makes a row
due sooner (a new scheduled or hand-off row, a retry, a requeue, "retry now", a re-enabled channel)
NOTIFYs it (``triggers.wakeup_triggers``), and it asks again. A poll every :data:`POLL_SECONDS`
covers a notification that never came (a dropped connection, a writer with triggers disabled). So
while nothing is due, a worker costs the database one cheap statement per poll, plus its tick (lock,
heartbeat, bookkeeping) once an interval.

Rows due that the last tick could not take (channel paused, circuit open, rows set aside as poison,
the lock held by another worker) must not make the worker tick again at once, over and over: after
a tick that took nothing, only rows falling due after that tick began count, until the interval
ends or a paused channel may send again.

A wait that cannot ask the database (a connection cut by a pooler, a proxy or a failover, a server
restarting, an answer psycopg cannot read) heals itself: the port drops its connection, the wait
pauses :data:`RECONNECT_FIRST_SECONDS`, doubled after each further failure up to the poll's period,
and asks again on a new connection; so a worker whose connections were cut still wakes when its next
row falls due, not at the end of its interval. The first failure of a run is logged
(``wakeup-wait-failed``), and the question that succeeds again (``wakeup-wait-recovered``).

The rule runs on a :class:`WakeupPort` (the database side), so unit tests drive it with a fake port
and a fake clock: no thread, no sleep.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg
import structlog

from notifications_retry.database.locks import RETRY_SECONDS, AdvisoryLock, PartitionLock
from notifications_retry.delivery import wakeup
from notifications_retry.engine.reporting import TickStats
from notifications_retry.observability.heartbeat_file import BEAT_SECONDS
from notifications_retry.rules.backoff import exponential_delay
from notifications_retry.runtime.clock import Clock

#: The fallback poll: the longest a worker waits without asking the database when its next row is due.
POLL_SECONDS = 2.0
#: The longest a wait runs without looking at the stop flag (a signal handler only sets it).
STOP_CHECK_SECONDS = 0.2
#: The pause after a wait could not ask the database, before it asks again on a new connection; doubled
#: after each further failure, up to the poll's period (a database that stays away costs a connection
#: attempt per poll, no more).
RECONNECT_FIRST_SECONDS = 0.25

default_log = structlog.get_logger("notifications_retry.worker")


class Wake(enum.Enum):
    """Why a wait ended."""

    DUE = "due"  # a row is due now
    INTERVAL = "interval"  # the interval ended (or a paused channel may send again)
    STOP = "stop"  # a stop was asked for


class WakeupPort(Protocol):
    """What the rule asks of the database."""

    def earliest_due(self, after: datetime | None) -> datetime | None:
        """The earliest due time of this worker's rows (later than ``after``, if given), or None."""

    def notified(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a wake-up notification; True when one came."""

    def reset(self) -> None:
        """Drop the connection after a failure: the next question opens a new one (and LISTENs)."""


class Waiter:
    """The wait between two ticks of a looping worker (see the module's docstring)."""

    def __init__(
        self,
        port: WakeupPort,
        *,
        clock: Clock,
        monotonic: Callable[[], float],
        stopping: Callable[[], bool],
        poll_seconds: float = POLL_SECONDS,
        sleep: Callable[[float], object] = time.sleep,
        log: Any = None,
    ) -> None:
        self.port = port
        self.clock = clock
        self.monotonic = monotonic
        self.stopping = stopping
        self.poll_seconds = poll_seconds
        #: Pauses between a failed question and the next (the worker's stop event waits, so a stop
        #: cuts the pause short).
        self.sleep = sleep
        self.log = log if log is not None else default_log
        #: Questions that failed in a row (across waits), and what the last one raised.
        self.failures = 0
        self.error: psycopg.Error | None = None
        self._failed_since = 0.0
        self._retry_at = 0.0

    def wait(self, *, until: float, after: datetime | None = None) -> Wake:
        """Wait until a row is due (later than ``after``, when given), or ``until`` (monotonic seconds).

        A question the database cannot answer is asked again on a new connection after a pause that
        grows with each failure in a row (module docstring): the wait goes on until ``until``.
        """
        while True:
            if self.failures:
                # Not past ``until``: the interval's end is the caller's to act on. The pause runs over
                # the caller's steps (wait_for_work's heartbeat and partition looks) too.
                self._pause(min(until, self._retry_at))
            try:
                return self._wait(until, after)
            except psycopg.Error as exc:
                self._failed(exc)

    def _failed(self, exc: psycopg.Error) -> None:
        """Count and log a failed question, and drop the port's connection."""
        self.failures += 1
        self.error = exc
        if self.failures == 1:
            self._failed_since = self.monotonic()
        # The first failure of a run, then at 2, 4, 8... in a row: a database away for long is said,
        # not logged once a poll.
        self._retry_at = self.monotonic() + self._backoff()
        if self.failures & (self.failures - 1) == 0:
            self.log.warning(
                "wakeup-wait-failed",
                error=f"{type(exc).__name__}: {exc}"[:300],
                failures=self.failures,
                retry_in_s=self._backoff(),
            )
        self.port.reset()

    def _backoff(self) -> float:
        return exponential_delay(max(1, self.failures), RECONNECT_FIRST_SECONDS, self.poll_seconds)

    def _recovered(self) -> None:
        self.log.info(
            "wakeup-wait-recovered",
            failures=self.failures,
            after_s=round(self.monotonic() - self._failed_since, 3),
        )
        self.failures = 0
        self.error = None

    def _pause(self, until: float) -> None:
        """Sleep until ``until`` (monotonic), looking at the stop flag at least every slice."""
        while not self.stopping():
            left = until - self.monotonic()
            if left <= 0:
                return
            self.sleep(min(left, STOP_CHECK_SECONDS))

    def _wait(self, until: float, after: datetime | None) -> Wake:
        while True:
            if self.stopping():
                return Wake.STOP
            now = self.monotonic()
            if now >= until:
                return Wake.INTERVAL
            earliest = self.port.earliest_due(after)
            if self.failures:
                self._recovered()
            due_at = math.inf
            if earliest is not None:
                delay = (earliest - self.clock.now()).total_seconds()
                if delay <= 0:
                    return Wake.DUE
                due_at = now + delay
            if not self._notified_before(min(until, due_at), now + self.poll_seconds):
                if self.stopping():
                    return Wake.STOP
                if self.monotonic() >= min(until, due_at):
                    return Wake.DUE if due_at <= until else Wake.INTERVAL
            # Notified, or the poll is due: ask for the earliest due time again.

    def wait_for_work(
        self,
        *,
        until: float,
        after: datetime | None,
        partitions: PartitionLock | None = None,
        beat: Callable[[], None] | None = None,
    ) -> Wake:
        """:meth:`wait`, and meanwhile: with ``partitions``, look every few seconds whether one is to
        be taken (its owner died or gave it back) or given back (a worker joined), which ends the wait
        (``DUE``: the next tick starts now); with ``beat``, call it at least every ``BEAT_SECONDS``
        (the heartbeat file, which says the process is alive while it waits)."""
        while True:
            step = until if partitions is None else min(until, self.monotonic() + RETRY_SECONDS)
            if beat is not None:
                step = min(step, self.monotonic() + BEAT_SECONDS)
            wake = self.wait(until=step, after=after)
            if beat is not None:
                beat()
            if wake is not Wake.INTERVAL or self.monotonic() >= until:
                return wake
            if partitions is None:
                continue  # woken only to write the heartbeat file
            try:
                if partitions.look():
                    return Wake.DUE
            except psycopg.Error:
                return Wake.DUE  # the tick meets the error and reports it

    def _notified_before(self, wake_at: float, poll_at: float) -> bool:
        """Wait for a notification until ``wake_at`` or ``poll_at``, looking at the stop flag meanwhile;
        False when none came (the timer ran out, the poll is due, or a stop was asked for)."""
        while not self.stopping():
            now = self.monotonic()
            if now >= min(wake_at, poll_at):
                return False
            if self.port.notified(min(wake_at, poll_at, now + STOP_CHECK_SECONDS) - now):
                return True
        return False


def wake_after(last: TickStats, *, batch_size: int, now: datetime, elapsed: float) -> datetime | None:
    """Which due rows may wake the worker after tick ``last``, which began ``elapsed`` seconds before
    ``now``: any (None) when the tick was cut short by its batch size, its deadline or a rebalance of
    partitions (it left due rows behind); else only rows falling due after it began (the ones due before
    that it could not take)."""
    cut_short = last.deadline_reached or last.rebalanced or (last.claims >= batch_size and not last.skipped)
    return None if cut_short else now - timedelta(seconds=elapsed)


def reopens_at(pauses: Sequence[float], now: float) -> float:
    """The earliest of the channels' pause and cool-down ends still ahead of ``now`` (inf: none)."""
    return min((at for at in pauses if at > now), default=math.inf)


class LockConnectionPort:
    """The :class:`WakeupPort` on the advisory lock's direct connection, LISTENing from first use
    (again after a reconnection).

    ``on_outbox``: each question also asks whether an outbox event waits, and tells this callable (the
    worker's relay, engine.loop_tasks): the wait's poll is its look at the outbox, in the same statement.
    """

    def __init__(
        self,
        lock: AdvisoryLock,
        *,
        channels: Collection[str] | None,
        priorities: Sequence[int] | None,
        on_outbox: Callable[[bool], None] | None = None,
    ) -> None:
        self.lock = lock
        self.channels = channels
        self.priorities = priorities
        self.on_outbox = on_outbox
        self._listening: Any = None

    def _conn(self) -> psycopg.Connection[Any]:
        conn = self.lock.session()
        if conn is not self._listening:
            wakeup.listen(conn)
            self._listening = conn
        return conn

    def earliest_due(self, after: datetime | None) -> datetime | None:
        conn = self._conn()
        wakeup.notified(conn, 0.0)  # what came before this question is answered by it
        due, waiting = wakeup.next_due(
            conn,
            after=after,
            channels=self.channels,
            priorities=self.priorities,
            outbox=self.on_outbox is not None,
        )
        if self.on_outbox is not None:
            self.on_outbox(waiting)
        return due

    def notified(self, seconds: float) -> bool:
        return wakeup.notified(self._conn(), seconds)

    def reset(self) -> None:
        # The lock's session is the one that failed: close it (a session lock dies with it anyway,
        # and between ticks a lane's lock is not held); the next question reconnects and LISTENs.
        self.lock.close()
        self._listening = None


__all__ = [
    "POLL_SECONDS",
    "RECONNECT_FIRST_SECONDS",
    "LockConnectionPort",
    "Waiter",
    "Wake",
    "WakeupPort",
    "reopens_at",
    "wake_after",
]
