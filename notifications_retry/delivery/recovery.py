"""Recovery jobs: start, work through in chunks, cancel. The command and the admin call these.

A chunk is one transaction: it locks the job row, reads up to ``chunk_size`` matching rows past the
job's keyset cursor, requeues them through :func:`notifications_retry.delivery.triage.requeue` (which
locks, checks and audits each row, exactly as a requeue from the admin does), and stores the advanced
cursor and counts. A dead letter whose recipient is suppressed on its channel is not requeued: the
requeue refuses it, and the job counts it among the refused under its reason ("suppressed: …"), as
the command's and the admin's counts show. The requeues and the cursor commit together: a runner
killed at any point leaves either the whole chunk done and counted, or none of it, so a resumed run
neither skips nor repeats a row.

Two runners on one job take turns (the job row's lock), and at most one pending or running job exists
per filter (a unique constraint), so a second job on the same filter is refused instead of doubling the
work. Rows that die again after the job was created are outside its filter (see ``RecoveryJob.matching``).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import structlog
from django.db import IntegrityError, transaction
from django.db.models import Q

from notifications_retry.conf import get_settings
from notifications_retry.delivery.recovery_filter import RecoveryFilter
from notifications_retry.exceptions import NotificationsRetryError
from notifications_retry.models import RecoveryJob
from notifications_retry.rules.outcomes import REPLAY
from notifications_retry.runtime.clock import Clock, default_clock

from . import triage

log = structlog.get_logger("notifications_retry.recovery")

#: Rows per chunk: one transaction each, short enough that a cancel or the worker never waits long.
CHUNK_SIZE = 500
#: A running job whose last chunk is older than this has lost its runner: ``work`` takes it over.
STALE_AFTER = timedelta(seconds=60)
State = RecoveryJob.State


class RecoveryConflict(NotificationsRetryError):
    """A job on the same filter is already pending or running."""

    def __init__(self, existing: RecoveryJob) -> None:
        super().__init__(
            f"recovery job #{existing.pk} ({existing.state}) already covers this filter: "
            f"resume it (notifications_recover --resume {existing.pk}) or cancel it first"
        )
        self.existing = existing


class RecoveryStateError(NotificationsRetryError):
    """The job is not in a state that allows the operation (resume a finished job, cancel a done one)."""


@dataclasses.dataclass(frozen=True)
class ChunkReport:
    """What one chunk did."""

    requeued: int
    refused: int
    state: str


def _clock(clock: Clock | None) -> Clock:
    return clock or default_clock(get_settings().CLOCK)


def start_job(
    selection: RecoveryFilter, *, actor: str, reason: str = "", clock: Clock | None = None
) -> RecoveryJob:
    """Create a pending job for ``selection`` (its rows counted now); refused if one is active on it."""
    now = _clock(clock).now()
    job = RecoveryJob(
        channel=selection.channel,
        since=selection.since,
        until=selection.until,
        row_status=selection.row_status,
        started_by=actor,
        reason=reason,
        created_at=now,
    )
    job.total = job.matching().count()
    try:
        with transaction.atomic():
            job.save()
    except IntegrityError:
        existing = _active_on(selection)
        if existing is None:
            raise
        raise RecoveryConflict(existing) from None
    log.info("recovery-job-created", job=job.pk, total=job.total, actor=actor, **job.filter_description())
    return job


def _active_on(selection: RecoveryFilter) -> RecoveryJob | None:
    return RecoveryJob.objects.filter(
        channel=selection.channel,
        since=selection.since,
        until=selection.until,
        row_status=selection.row_status,
        state__in=RecoveryJob.ACTIVE_STATES,
    ).first()


def run_chunk(job_id: int, *, chunk_size: int = CHUNK_SIZE, clock: Clock | None = None) -> ChunkReport:
    """Requeue the next chunk of a running job and advance its cursor, in one transaction."""
    now = _clock(clock).now()
    with transaction.atomic():
        job = RecoveryJob.objects.select_for_update().get(pk=job_id)
        if job.state != State.RUNNING:
            return ChunkReport(0, 0, job.state)
        batch = list(job.remaining().values_list("pk", "dead_lettered_at")[:chunk_size])
        if not batch:
            job.state, job.finished_at, job.heartbeat_at = State.DONE, now, now
            job.save(update_fields=["state", "finished_at", "heartbeat_at"])
            log.info("recovery-job-done", job=job.pk, done=job.done, failed=job.failed)
            return ChunkReport(0, 0, job.state)
        reason = f"recovery job #{job.pk}" + (f": {job.reason}" if job.reason else "")
        result = triage.requeue(
            [pk for pk, _ in batch], actor=job.started_by, reason=reason, now=now, trigger=REPLAY
        )
        refusals = Counter(job.refusals)
        refusals.update(result.refused.values())
        job.done += len(result.done)
        job.failed += len(result.refused)
        job.refusals = dict(refusals)
        job.cursor_id, job.cursor_at = batch[-1]
        job.heartbeat_at = now
        job.save(update_fields=["done", "failed", "refusals", "cursor_id", "cursor_at", "heartbeat_at"])
        return ChunkReport(len(result.done), len(result.refused), job.state)


def begin(job_id: int, *, clock: Clock | None = None) -> RecoveryJob:
    """Mark a pending (or interrupted: running, failed) job running; done and cancelled ones are refused."""
    now = _clock(clock).now()
    with transaction.atomic():
        job = RecoveryJob.objects.select_for_update().get(pk=job_id)
        if job.state in (State.DONE, State.CANCELLED):
            raise RecoveryStateError(f"recovery job #{job.pk} is {job.state}: nothing to resume")
        job.state, job.heartbeat_at, job.last_error = State.RUNNING, now, ""
        job.started_at = job.started_at or now
        job.save(update_fields=["state", "heartbeat_at", "last_error", "started_at"])
    return job


def run_job(
    job_id: int,
    *,
    chunk_size: int = CHUNK_SIZE,
    clock: Clock | None = None,
    on_chunk: Callable[[RecoveryJob], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    pause: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> RecoveryJob:
    """Work through a job until it is done or cancelled, or ``should_stop()`` (then it goes back to pending).

    ``on_chunk`` gets the job, fresh from the database, after each committed chunk (a progress display).
    ``pause`` seconds between chunks leave the database to the worker's drain (docs/performance.md).
    An error marks the job failed with the error and is raised again; the job stays resumable.
    """
    clock = _clock(clock)
    begin(job_id, clock=clock)
    try:
        while True:
            report = run_chunk(job_id, chunk_size=chunk_size, clock=clock)
            job = RecoveryJob.objects.get(pk=job_id)
            if on_chunk is not None:
                on_chunk(job)
            if report.state != State.RUNNING:
                return job
            if should_stop():
                return _pause(job_id)
            if pause > 0:
                sleep(pause)
    except Exception as exc:
        _mark_failed(job_id, exc, clock)
        raise


def _pause(job_id: int) -> RecoveryJob:
    """A runner asked to stop leaves its job pending, for the next runner; a cancel in between wins."""
    with transaction.atomic():
        job = RecoveryJob.objects.select_for_update().get(pk=job_id)
        if job.state == State.RUNNING:
            job.state = State.PENDING
            job.save(update_fields=["state"])
    return job


def _mark_failed(job_id: int, exc: BaseException, clock: Clock) -> None:
    try:
        with transaction.atomic():
            RecoveryJob.objects.filter(pk=job_id, state=State.RUNNING).update(
                state=State.FAILED, last_error=f"{type(exc).__name__}: {exc}"[:2000], finished_at=clock.now()
            )
    except Exception:  # the database may be what failed: the job then stays running, and goes stale
        log.exception("recovery-job-not-marked-failed", job=job_id)
    log.error("recovery-job-failed", job=job_id, error=f"{type(exc).__name__}: {exc}")


def cancel_job(job_id: int, *, actor: str, clock: Clock | None = None) -> RecoveryJob:
    """Stop a pending or running job after its current chunk; what it requeued stays requeued."""
    now = _clock(clock).now()
    with transaction.atomic():
        job = RecoveryJob.objects.select_for_update().get(pk=job_id)
        if not job.is_active and job.state != State.FAILED:
            raise RecoveryStateError(f"recovery job #{job.pk} is {job.state}: nothing to cancel")
        job.state, job.finished_at, job.cancelled_by = State.CANCELLED, now, actor
        job.save(update_fields=["state", "finished_at", "cancelled_by"])
    log.info("recovery-job-cancelled", job=job.pk, actor=actor, done=job.done)
    return job


def next_job(*, stale_after: timedelta = STALE_AFTER, clock: Clock | None = None) -> RecoveryJob | None:
    """The oldest job waiting for a runner: pending, or running with no chunk for ``stale_after``."""
    now = _clock(clock).now()
    return (
        RecoveryJob.objects.filter(
            Q(state=State.PENDING) | Q(state=State.RUNNING, heartbeat_at__lt=now - stale_after)
        )
        .order_by("created_at", "pk")
        .first()
    )


def work(
    *,
    chunk_size: int = CHUNK_SIZE,
    stale_after: timedelta = STALE_AFTER,
    clock: Clock | None = None,
    on_chunk: Callable[[RecoveryJob], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    pause: float = 0.0,
) -> list[RecoveryJob]:
    """Run every job waiting for a runner, oldest first, until none is left or ``should_stop()``."""
    clock = _clock(clock)
    finished: list[RecoveryJob] = []
    while not should_stop():
        job = next_job(stale_after=stale_after, clock=clock)
        if job is None:
            break
        finished.append(
            run_job(
                job.pk,
                chunk_size=chunk_size,
                clock=clock,
                on_chunk=on_chunk,
                should_stop=should_stop,
                pause=pause,
            )
        )
    return finished
