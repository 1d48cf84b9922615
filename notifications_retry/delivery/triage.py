"""Dead-letter operations: requeue, discard, expiry. The admin, the public API and recovery jobs call these.

A requeue refuses a dead letter whose recipient is on the suppression list for its channel (or ``*``)
now: it would only be settled ``suppressed`` again at its next claim, with nothing sent. It stays a
dead letter, refused with the reason (:data:`SUPPRESSED_REFUSAL`), until the suppression is lifted.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from notifications_retry.delivery import suppression
from notifications_retry.models import (
    CANCELLED_ERROR_KIND,
    DeadLetterAction,
    NotificationEntity,
    NotificationQuerySet,
)
from notifications_retry.rules.outcomes import MANUAL, REPLAY, deadline_words

#: ``error_kind`` of a notification the application cancelled (``api.cancel_notification``).
CANCELLED = CANCELLED_ERROR_KIND
#: How a requeue's refusal of a suppressed recipient begins (then which entry: reason and channel).
SUPPRESSED_REFUSAL = "suppressed"


@dataclasses.dataclass
class TriageResult:
    """What an operation did: ids changed, and ids refused with the reason."""

    done: list[uuid.UUID] = dataclasses.field(default_factory=list)
    refused: dict[uuid.UUID, str] = dataclasses.field(default_factory=dict)


def _locked(ids: Iterable[uuid.UUID | str]) -> tuple[list[NotificationEntity], set[str]]:
    wanted = {str(i) for i in ids}
    # Only what the refusal messages read: a chunk of a recovery job must not load hundreds of payloads.
    rows = list(
        NotificationEntity.objects.select_for_update()
        .filter(pk__in=wanted)
        .only("pk", "status", "attempts", "dead_lettered_at", "error_kind", "expires_at", "resolution")
        .order_by("pk")
    )
    missing = wanted - {str(r.pk) for r in rows}
    return rows, missing


def _allowed(rows: list[NotificationEntity], eligible: NotificationQuerySet) -> set[uuid.UUID]:
    """Which of the locked ``rows`` the eligibility QuerySet (the rule the admin shows too) lets through."""
    return set(eligible.filter(pk__in=[r.pk for r in rows]).values_list("pk", flat=True))


def _requeue_refusal(row: NotificationEntity, now: datetime) -> str:
    """Why ``requeueable()`` left ``row`` out, in the operator's words (the QuerySet decides)."""
    if row.dead_lettered_at is None:
        return f"not a dead letter (status {row.status})"
    if row.error_kind == CANCELLED:
        return "cancelled by the application: requeuing would send what it withdrew"
    if row.expires_at is not None and row.expires_at <= now:
        return f"its {deadline_words(row.expires_at)} has passed: it would only expire again"
    return "not eligible for a requeue"


def suppressed_recipients(ids: Iterable[uuid.UUID | str], *, now: datetime) -> dict[uuid.UUID, str]:
    """Which of these notifications a requeue refuses because their recipient is suppressed now, and why.

    Two statements whatever the number of ids (a recovery job's chunk): their recipients and channels,
    then the suppression list's lookup for the whole batch, the one the worker's claim makes.
    """
    wanted = [str(i) for i in ids]
    if not wanted:
        return {}
    recipients = list(
        NotificationEntity.objects.filter(pk__in=wanted).values_list("pk", "channel__key", "recipient")
    )
    with connection.cursor() as cursor:
        found = suppression.suppressed_in_batch(cursor, recipients, now)
    return {pk: f"{SUPPRESSED_REFUSAL}: {why}" for pk, why in found.items()}


def _discard_refusal(row: NotificationEntity) -> str:
    """Why ``discardable()`` left ``row`` out, in the operator's words."""
    if row.dead_lettered_at is None:
        return f"not a dead letter (status {row.status})"
    return "already discarded"


def requeue(
    ids: Iterable[uuid.UUID | str],
    *,
    actor: str,
    reason: str = "",
    now: datetime | None = None,
    trigger: str = MANUAL,
) -> TriageResult:
    """Give dead letters a fresh attempt budget, due now; same NotificationId, audited.

    Refused, each with its reason: what ``requeueable()`` leaves out, and a dead letter whose recipient
    is suppressed on its channel now (:func:`suppressed_recipients`). ``trigger`` names, in the next
    attempt's log entry, what started it: ``manual`` (an operator) or ``replay`` (a recovery job).
    """
    if trigger not in (MANUAL, REPLAY):
        raise ValueError(f"a requeue's trigger is {MANUAL!r} or {REPLAY!r}, not {trigger!r}")
    now = now or timezone.now()
    result = TriageResult()
    with transaction.atomic():
        rows, missing = _locked(ids)
        for pk in missing:
            result.refused[uuid.UUID(pk)] = "no such notification"
        allowed = _allowed(rows, NotificationEntity.objects.requeueable(now))
        stopped = suppressed_recipients(allowed, now=now)
        chosen = []
        for row in rows:
            if row.pk not in allowed:
                result.refused[row.pk] = _requeue_refusal(row, now)
            elif row.pk in stopped:
                result.refused[row.pk] = stopped[row.pk]
            else:
                chosen.append(row)
        # Set-based, so a recovery job's chunk of hundreds costs two statements, not two per row.
        # The audit rows go first: the database refuses a requeue without one (nr_requeue_audited).
        DeadLetterAction.objects.bulk_create(
            _audit(row, DeadLetterAction.Action.REQUEUE, actor=actor, reason=reason, now=now)
            for row in chosen
        )
        NotificationEntity.objects.filter(pk__in=[row.pk for row in chosen]).update(
            attempts=0,
            requeue_count=F("requeue_count") + 1,
            dead_lettered_at=None,
            dead_letter_reason="",
            resolution="",
            resolved_at=None,
            next_attempt_at=now,
            next_trigger=trigger,
            updated_at=now,
        )
        result.done.extend(row.pk for row in chosen)
    return result


def discard(
    ids: Iterable[uuid.UUID | str], *, actor: str, reason: str = "", now: datetime | None = None
) -> TriageResult:
    """Resolve dead letters without sending them; audited."""
    now = now or timezone.now()
    result = TriageResult()
    with transaction.atomic():
        rows, missing = _locked(ids)
        for pk in missing:
            result.refused[uuid.UUID(pk)] = "no such notification"
        allowed = _allowed(rows, NotificationEntity.objects.discardable())
        for row in rows:
            if row.pk not in allowed:
                result.refused[row.pk] = _discard_refusal(row)
                continue
            discard_row(row, actor=actor, reason=reason, now=now)
            result.done.append(row.pk)
    return result


def discard_row(row: NotificationEntity, *, actor: str, reason: str, now: datetime) -> None:
    """Resolve one dead letter, locked by the caller's transaction, as discarded; audited."""
    _audit(row, DeadLetterAction.Action.DISCARD, actor=actor, reason=reason, now=now).save(force_insert=True)
    NotificationEntity.objects.filter(pk=row.pk).update(
        resolution=NotificationEntity.Resolution.DISCARDED, resolved_at=now, updated_at=now
    )


def _audit(
    row: NotificationEntity, action: str, *, actor: str, reason: str, now: datetime
) -> DeadLetterAction:
    """The triage audit row of ``action`` on ``row`` (unsaved)."""
    return DeadLetterAction(
        notification=row,
        action=action,
        actor=actor,
        reason=reason,
        attempts_before=row.attempts,
        created_at=now,
    )


def expire_dead_letters(*, retention: timedelta, now: datetime | None = None) -> int:
    """Mark unresolved dead letters older than ``retention`` unresolvable; returns how many."""
    now = now or timezone.now()
    with transaction.atomic():
        rows = list(
            NotificationEntity.objects.unresolved_dead_letters()
            .filter(dead_lettered_at__lt=now - retention)
            .select_for_update(skip_locked=True)
            .only("pk", "attempts")
        )
        DeadLetterAction.objects.bulk_create(
            DeadLetterAction(
                notification=row,
                action=DeadLetterAction.Action.EXPIRE,
                actor="system",
                reason=f"unresolved for more than {retention}",
                attempts_before=row.attempts,
                created_at=now,
            )
            for row in rows
        )
        NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]).update(
            resolution=NotificationEntity.Resolution.UNRESOLVABLE, resolved_at=now, updated_at=now
        )
    return len(rows)


@dataclasses.dataclass(frozen=True)
class GenerationSummary:
    """The attempts of one generation (before the first requeue, between requeues, after the last)."""

    generation: int
    attempts: int
    first_at: str | None
    last_at: str | None
    outcome: str
    error_kinds: dict[str, int]
    last_error: str | None


@dataclasses.dataclass(frozen=True)
class DeadLetterSummary:
    """A dead letter kept whole: what was to be sent, to whom, why it failed, and its history."""

    notification_id: uuid.UUID
    channel: str
    recipient: str
    payload: Any
    notification_type: str
    status: str
    error_kind: str
    last_error: str
    dead_lettered_at: datetime | None
    dead_letter_reason: str
    resolution: str
    attempts: int
    requeue_count: int
    history: list[GenerationSummary]
    actions: list[DeadLetterAction]


def attempt_history(attempt_log: list[dict[str, Any]]) -> list[GenerationSummary]:
    """Group ``attempt_log`` by generation: how many attempts, when, how each run ended, which errors."""
    runs: dict[int, list[dict[str, Any]]] = {}
    for entry in attempt_log or []:
        runs.setdefault(int(entry.get("generation") or 0), []).append(entry)
    summaries = []
    for generation, entries in sorted(runs.items()):
        kinds = Counter(str(e["error_kind"]) for e in entries if e.get("error_kind"))
        errors = [e.get("error") for e in entries if e.get("error")]
        summaries.append(
            GenerationSummary(
                generation=generation,
                attempts=len(entries),
                first_at=entries[0].get("at"),
                last_at=entries[-1].get("at"),
                outcome=str(entries[-1].get("outcome", "")),
                error_kinds=dict(kinds),
                last_error=errors[-1] if errors else None,
            )
        )
    return summaries


def dead_letter_summary(notification: NotificationEntity | uuid.UUID | str) -> DeadLetterSummary:
    """Everything an operator needs to triage one notification (a dead letter, or one that was)."""
    pk = notification.pk if isinstance(notification, NotificationEntity) else notification
    row = NotificationEntity.objects.select_related("channel").get(pk=pk)
    return DeadLetterSummary(
        notification_id=row.pk,
        channel=row.channel.key,
        recipient=row.recipient,
        payload=row.payload,
        notification_type=row.notification_type,
        status=row.status,
        error_kind=row.error_kind,
        last_error=row.last_error,
        dead_lettered_at=row.dead_lettered_at,
        dead_letter_reason=row.dead_letter_reason,
        resolution=row.resolution,
        attempts=row.attempts,
        requeue_count=row.requeue_count,
        history=attempt_history(row.attempt_log),
        actions=list(row.triage_log.order_by("created_at", "id")),
    )
