"""Housekeeping: set aside rows with times Python cannot read, expire stale dead letters, prune published
outbox rows, old backlog samples, suppressions whose expiry has passed, endpoint-health buckets that left
the health window and, when ``SENT_RETENTION_DAYS`` is set, old Sent rows.

``retry_worker`` runs it on its loop (:class:`HousekeepingTask`), in one worker at a time: the one holding
the housekeeping advisory lock, elected as River elects the leader that runs its maintenance services.
``manage.py notifications_housekeeping`` runs it once, for deployments that start workers with
``--no-housekeeping`` (a daily CronJob). Each step is a short transaction (a batch, for large
deletions), so it runs next to the worker and the relay. The notification and outbox rows are written by
:mod:`notifications_retry.delivery` (``unreadable_times``, ``triage``, ``outbox``, ``suppression``,
``retention``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta

import structlog
from django.utils import timezone

from notifications_retry.database.locks import AdvisoryLock
from notifications_retry.delivery.events import prune_published_outbox, prune_published_outbox_batches
from notifications_retry.delivery.health import prune_buckets
from notifications_retry.delivery.retention import prune_sent_batches
from notifications_retry.delivery.suppression import prune_expired
from notifications_retry.delivery.triage import expire_dead_letters
from notifications_retry.delivery.unreadable_times import everywhere as set_aside_unreadable_times
from notifications_retry.runtime.clock import Clock

from .conf import get_settings
from .models import BacklogSample

log = structlog.get_logger("notifications_retry.housekeeping")

#: How often the elected worker runs housekeeping; a worker that is not elected asks again as often.
#: Hourly: each run then has an hour's rows to delete, and every retention is in days (or hours).
EVERY_SECONDS = 3600.0
#: How long after its start a worker first asks to be elected: a restarted worker serves its backlog
#: first, and a short-lived one (``--once``, a test) never runs housekeeping.
FIRST_SECONDS = 60.0
#: The most one turn of the worker's loop spends on housekeeping, and the most of the loop's time its
#: turns take while there is more to delete: sends wait while it runs.
TURN_SECONDS = 0.25
SHARE = 0.1
#: After a failed step, the next run waits this long, doubling up to :data:`EVERY_SECONDS`.
RETRY_SECONDS = 60.0
#: Backlog samples (the admin dashboard's history) older than this are deleted: two days, the default
#: 24 h chart and the day before it to compare with (the 7-day range shows these two days). A worker
#: writes one every 10 s at most: about 17,000 rows a worker are kept (``--sample-hours`` overrides).
BACKLOG_SAMPLE_RETENTION_HOURS = 48

#: First half of the two-int advisory-lock key of the housekeeping leader ("nrhk"): apart from the cycle
#: lock (a bigint key) and the relay's key locks.
LEADER_CLASS = 0x6E72686B


@dataclasses.dataclass(frozen=True)
class HousekeepingReport:
    """How many rows each step touched."""

    expired_dead_letters: int
    pruned_outbox: int
    pruned_backlog_samples: int
    pruned_suppressions: int = 0
    pruned_health_buckets: int = 0
    pruned_sent: int = 0
    #: Rows with a time Python cannot read, set aside as dead letters (``unreadable_time``).
    set_aside_unreadable: int = 0


def prune_backlog_samples(*, older_than: datetime) -> int:
    """Delete backlog samples taken before ``older_than``."""
    deleted, _ = BacklogSample.objects.filter(taken_at__lt=older_than).delete()
    return deleted


def housekeeping_steps(
    *,
    now: datetime,
    dead_letter_retention: timedelta | None = None,
    outbox_retention: timedelta | None = None,
    sample_retention: timedelta | None = None,
    sent_retention: timedelta | None = None,
) -> Iterator[tuple[str, int]]:
    """Every step of a run, one short transaction each, lazily: yields (report field, rows touched).

    Retentions come from the settings unless given; Sent rows are pruned only when ``sent_retention`` is
    given or ``SENT_RETENTION_DAYS`` is set."""
    conf = get_settings()
    dead_letter_retention = dead_letter_retention or timedelta(days=conf.DEAD_LETTER_RETENTION_DAYS)
    outbox_retention = outbox_retention or timedelta(days=conf.OUTBOX_RETENTION_DAYS)
    sample_retention = sample_retention or timedelta(hours=BACKLOG_SAMPLE_RETENTION_HOURS)
    if sent_retention is None and conf.SENT_RETENTION_DAYS is not None:
        sent_retention = timedelta(days=conf.SENT_RETENTION_DAYS)
    for found in set_aside_unreadable_times(now):
        yield "set_aside_unreadable", found
    yield "expired_dead_letters", expire_dead_letters(retention=dead_letter_retention, now=now)
    for deleted in prune_published_outbox_batches(older_than=now - outbox_retention):
        yield "pruned_outbox", deleted
    yield "pruned_backlog_samples", prune_backlog_samples(older_than=now - sample_retention)
    yield "pruned_suppressions", prune_expired(now=now)
    yield "pruned_health_buckets", prune_buckets(now=now)
    if sent_retention is not None:
        for deleted in prune_sent_batches(older_than=now - sent_retention):
            yield "pruned_sent", deleted


def _report(counts: dict[str, int]) -> HousekeepingReport:
    fields = {f.name: 0 for f in dataclasses.fields(HousekeepingReport)}
    fields.update(counts)
    return HousekeepingReport(**fields)


def run_housekeeping(
    *,
    now: datetime | None = None,
    dead_letter_retention: timedelta | None = None,
    outbox_retention: timedelta | None = None,
    sample_retention: timedelta | None = None,
    sent_retention: timedelta | None = None,
) -> HousekeepingReport:
    """Every step, with retentions from the settings unless given."""
    counts: dict[str, int] = {}
    for field, rows in housekeeping_steps(
        now=now or timezone.now(),
        dead_letter_retention=dead_letter_retention,
        outbox_retention=outbox_retention,
        sample_retention=sample_retention,
        sent_retention=sent_retention,
    ):
        counts[field] = counts.get(field, 0) + rows
    report = _report(counts)
    log.info("housekeeping-completed", **dataclasses.asdict(report))
    return report


class Leadership:
    """The housekeeping leader's advisory lock, on the worker's lock connection (no connection of its own).

    Held for as long as that session lives: a leader keeps its role until it stops or its session ends
    (a killed worker's at once; a hung one's after ``LOCK_IDLE_SESSION_TIMEOUT_SECONDS``); then the next
    worker that asks takes it. A session lock taken again by its holder succeeds (and only stacks), so
    asking is one statement, the same for the leader and the others.
    """

    def __init__(self, lock: AdvisoryLock, name: str) -> None:
        self.lock = lock
        self.name = name

    def lead(self) -> bool:
        """Whether this worker leads now (taking the role if it is free); psycopg's errors are raised."""
        row = (
            self.lock.session()
            .execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LEADER_CLASS, self.name))
            .fetchone()
        )
        return bool(row and row[0])


class HousekeepingTask:
    """Housekeeping as a task of the worker's loop (``engine.loop_tasks``): elected, hourly, in short turns.

    A run is :func:`housekeeping_steps`, taken a few steps a turn (at most about :data:`TURN_SECONDS`,
    and :data:`SHARE` of the loop's time while there is more): a large first prune never holds the
    sends up for long. Before each turn the worker asks again whether it leads; a run whose leader lost
    the role (its lock session ended) stops, and the next leader runs it whole.
    """

    name = "housekeeping"
    first_in = FIRST_SECONDS
    budget_seconds = TURN_SECONDS
    share = SHARE
    retry_seconds = RETRY_SECONDS
    retry_cap_seconds = EVERY_SECONDS

    def __init__(
        self,
        lock: AdvisoryLock,
        *,
        clock: Clock,
        monotonic: Callable[[], float],
        every: float = EVERY_SECONDS,
    ) -> None:
        self.leadership = Leadership(lock, f"{get_settings().LOCK_KEY}:housekeeping")
        self.clock = clock
        self.monotonic = monotonic
        self.every = every
        self._steps: Iterator[tuple[str, int]] | None = None
        self._counts: dict[str, int] = {}
        self._started = 0.0
        #: Runs this worker completed (for its tests and its log line).
        self.runs = 0

    def run(self, budget: float) -> float:
        """Up to ``budget`` seconds of the run (starting one if it leads); seconds until the next turn."""
        if not self.leadership.lead():
            self._steps = None  # another worker leads: it runs housekeeping
            return self.every
        if self._steps is None:
            self._steps = housekeeping_steps(now=self.clock.now())
            self._counts, self._started = {}, self.monotonic()
        deadline = self.monotonic() + budget
        try:
            for field, rows in self._steps:
                self._counts[field] = self._counts.get(field, 0) + rows
                if self.monotonic() >= deadline:
                    return 0.0  # more to do: the next turn goes on, within the task's share
        except BaseException:
            self._steps = None  # the next run starts afresh: every step is idempotent
            raise
        self._steps = None
        self.runs += 1
        report = _report(self._counts)
        log.info(
            "housekeeping-completed",
            seconds=round(self.monotonic() - self._started, 3),
            **dataclasses.asdict(report),
        )
        return self.every

    def close(self) -> None:
        """Nothing of its own to close: the leader's lock ends with the worker's lock session."""


__all__ = [
    "HousekeepingReport",
    "HousekeepingTask",
    "Leadership",
    "housekeeping_steps",
    "prune_backlog_samples",
    "prune_published_outbox",
    "run_housekeeping",
]
