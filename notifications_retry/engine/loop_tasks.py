"""The worker's tasks besides its ticks: the outbox relay, housekeeping, the outbox gauges, unreadable times.

``retry_worker`` runs them on its one loop, on its own thread, between ticks: after each tick, and
while it waits for the next (their timers end a slice of the wait, :class:`TasksWhileWaiting`). So
they share the worker's connections (Django's, and the cycle lock's session for their advisory locks)
and add none. A task's turn is short (its ``budget_seconds``), and while it has more to do its turns
take at most its ``share`` of the loop's time: due rows never wait long behind them. A task that
raises is logged (``worker-task-failed``), counted (``notifications_retry_task_failures_total``) and
run again after a backoff (doubling from its ``retry_seconds`` up to its ``retry_cap_seconds``): the
sends go on. Only :class:`~notifications_retry.database.locks.LockNotDirect`, a configuration to fix,
stops the worker, as it does at a tick.

The tasks themselves live where their work does (``outbox.relay.RelayTask``,
``housekeeping.HousekeepingTask``, :class:`OutboxGauges`): the command hands them to the worker.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

import structlog

from notifications_retry.database.locks import LockNotDirect
from notifications_retry.delivery import unreadable_times
from notifications_retry.engine.wakeup import WakeupPort
from notifications_retry.exceptions import first_line
from notifications_retry.models import Outbox
from notifications_retry.observability import metrics
from notifications_retry.rules.backoff import exponential_delay
from notifications_retry.runtime.clock import Clock

log = structlog.get_logger("notifications_retry.worker")


class LoopTask(Protocol):
    """A task of the worker's loop."""

    #: Its name in logs and in the ``task`` label of ``notifications_retry_task_failures_total``.
    name: str
    #: Seconds after the worker's start of its first turn.
    first_in: float
    #: The most one turn should take, and the most of the loop's time its turns may take back to back.
    budget_seconds: float
    share: float
    #: The backoff after a failed turn: from ``retry_seconds``, doubling, up to ``retry_cap_seconds``.
    retry_seconds: float
    retry_cap_seconds: float

    def run(self, budget: float) -> float:
        """Work for about ``budget`` seconds at most; returns the seconds until its next turn (0: as
        soon as its share allows, it has more to do)."""

    def close(self) -> None:
        """The worker closes (its connections are still open)."""


@dataclasses.dataclass
class _Entry:
    task: LoopTask
    due: float  # monotonic
    failures: int = 0


class LoopTasks:
    """The tasks of one worker's loop and when each runs next."""

    def __init__(self, *, monotonic: Callable[[], float], stopping: Callable[[], bool]) -> None:
        self.monotonic = monotonic
        self.stopping = stopping
        self._entries: list[_Entry] = []

    def add(self, task: LoopTask) -> None:
        """Run ``task`` from ``task.first_in`` seconds from now on."""
        self._entries.append(_Entry(task, self.monotonic() + task.first_in))
        metrics.TASK_FAILURES.labels(task.name)  # the series exists at zero before a first failure

    @property
    def names(self) -> list[str]:
        return [entry.task.name for entry in self._entries]

    def next_at(self) -> float:
        """When the next task is due (monotonic; inf when there is none)."""
        return min((entry.due for entry in self._entries), default=math.inf)

    def run_due(self) -> None:
        """Run every task that is due (none once the worker stops)."""
        for entry in self._entries:
            if self.stopping():
                return
            started = self.monotonic()
            if entry.due > started:
                continue
            task = entry.task
            try:
                delay = task.run(task.budget_seconds)
            except LockNotDirect:
                raise
            except Exception as exc:  # any failure of a task: the sends must go on
                entry.failures += 1
                delay = exponential_delay(entry.failures, task.retry_seconds, task.retry_cap_seconds)
                metrics.TASK_FAILURES.labels(task.name).inc()
                log.warning(
                    "worker-task-failed",
                    task=task.name,
                    error=first_line(exc)[:300],
                    failures=entry.failures,
                    retry_in_s=round(delay, 3),
                )
            else:
                entry.failures = 0
            took = self.monotonic() - started
            # Back to back, a task takes at most its share of the loop's time.
            entry.due = self.monotonic() + max(delay, took * (1 - task.share) / task.share)

    def nudge(self, name: str) -> None:
        """Make the task called ``name`` due now (the relay, after a tick that settled rows)."""
        now = self.monotonic()
        for entry in self._entries:
            if entry.task.name == name and entry.failures == 0:
                entry.due = min(entry.due, now)

    @property
    def watch_outbox(self) -> bool:
        """Whether a task looks at the outbox when idle (the relay): the wait's poll can look for it."""
        return any(getattr(entry.task, "outbox_seen", None) is not None for entry in self._entries)

    def outbox_seen(self, waiting: bool) -> None:
        """The wait's poll looked at the outbox (``waiting``: an event waits to be published): each task
        that looks at it too says when its next turn is now (engine.wakeup's ``on_outbox``)."""
        now = self.monotonic()
        for entry in self._entries:
            seen = getattr(entry.task, "outbox_seen", None)
            if seen is None or entry.failures:  # a failing task keeps its backoff
                continue
            delay = seen(waiting)
            if delay is not None:
                entry.due = now + delay

    def stop(self) -> None:
        """The worker was asked to stop: tasks that can cut their work short (the relay's publishing) do."""
        for entry in self._entries:
            stop = getattr(entry.task, "stop", None)
            if stop is not None:
                stop()

    def close(self) -> None:
        """Close every task (errors are logged: the worker goes on closing)."""
        for entry in self._entries:
            try:
                entry.task.close()
            except Exception as exc:
                log.warning("worker-task-close-failed", task=entry.task.name, error=first_line(exc)[:300])
        self._entries.clear()

    def around(self, port: WakeupPort) -> WakeupPort:
        """``port``, with these tasks run while the worker waits on it."""
        return TasksWhileWaiting(port, self)


class TasksWhileWaiting:
    """The wait's port (engine.wakeup), cutting its waits for notifications at the tasks' next turn.

    The wait looks at the clock, the stop flag and the partitions after each wait for a notification
    (a slice of at most a fraction of a second), so a task that runs in one of them changes nothing of
    how it decides; a task's errors never reach the wait.
    """

    def __init__(self, port: WakeupPort, tasks: LoopTasks) -> None:
        self.port = port
        self.tasks = tasks

    def earliest_due(self, after: datetime | None) -> datetime | None:
        return self.port.earliest_due(after)

    def notified(self, seconds: float) -> bool:
        next_at = self.tasks.next_at()
        if next_at <= self.tasks.monotonic():
            self.tasks.run_due()
            return False  # the wait looks at its clock, then asks again
        return self.port.notified(max(0.0, min(seconds, next_at - self.tasks.monotonic())))

    def reset(self) -> None:
        """The wait failed on the port's connection: the port drops it (when it can)."""
        reset = getattr(self.port, "reset", None)
        if reset is not None:
            reset()


#: How often the worker reads the outbox's backlog for its gauges (about a scrape interval).
GAUGE_SECONDS = 10.0


class OutboxGauges:
    """``notifications_retry_outbox_unpublished`` and ``..._oldest_unpublished_age_seconds``, every
    :data:`GAUGE_SECONDS`: whoever relays (this worker, another, or ``outbox_relay``), a stuck relay
    shows (``NotificationsOutboxRelayStuck``). Two reads of the partial index on unpublished events."""

    name = "outbox-gauges"
    first_in = 0.0
    budget_seconds = 1.0
    share = 0.1
    retry_seconds = GAUGE_SECONDS
    retry_cap_seconds = 6 * GAUGE_SECONDS

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def run(self, budget: float) -> float:
        backlog = Outbox.objects.backlog(self.clock.now())
        metrics.OUTBOX_UNPUBLISHED.set(backlog.unpublished)
        metrics.OUTBOX_OLDEST_UNPUBLISHED_AGE.set(backlog.oldest_unpublished_age_seconds)
        return GAUGE_SECONDS

    def close(self) -> None:
        """Nothing to close."""


#: How often a worker looks for rows whose due time it cannot read (two probes of the due index).
UNREADABLE_SECONDS = 60.0


class UnreadableDueTimes:
    """Rows whose due time Python cannot read ('infinity', year 12000: never due, and no page loads
    them) set aside as dead letters with their reason, at the worker's first turn after its first tick
    and every :data:`UNREADABLE_SECONDS`: a lane never waits for housekeeping's hourly run to learn of
    one (:func:`notifications_retry.delivery.unreadable_times.due_ends`, the two ends of the due index)."""

    name = "unreadable-times"
    first_in = 0.0
    budget_seconds = 1.0
    share = 0.1
    retry_seconds = UNREADABLE_SECONDS
    retry_cap_seconds = 10 * UNREADABLE_SECONDS

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def run(self, budget: float) -> float:
        found = unreadable_times.set_aside_batch(self.clock.now(), due_only=True)
        # A full batch: the next turn takes the next one, within the task's share.
        return 0.0 if len(found) == unreadable_times.BATCH_ROWS else UNREADABLE_SECONDS

    def close(self) -> None:
        """Nothing to close."""


__all__ = [
    "GAUGE_SECONDS",
    "UNREADABLE_SECONDS",
    "LoopTask",
    "LoopTasks",
    "OutboxGauges",
    "TasksWhileWaiting",
    "UnreadableDueTimes",
]
