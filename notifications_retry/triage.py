"""Dead-letter operations: requeue, discard, expiry. The admin and the public API call these."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from .models import DeadLetterAction, NotificationEntity


@dataclasses.dataclass
class TriageResult:
    """What an operation did: ids changed, and ids refused with the reason."""

    done: list[uuid.UUID] = dataclasses.field(default_factory=list)
    refused: dict[uuid.UUID, str] = dataclasses.field(default_factory=dict)


def _locked(ids: Iterable[uuid.UUID | str]) -> tuple[list[NotificationEntity], set[str]]:
    wanted = {str(i) for i in ids}
    rows = list(NotificationEntity.objects.select_for_update().filter(pk__in=wanted).order_by("pk"))
    missing = wanted - {str(r.pk) for r in rows}
    return rows, missing


def requeue(
    ids: Iterable[uuid.UUID | str], *, actor: str, reason: str = "", now: datetime | None = None
) -> TriageResult:
    """Give dead letters a fresh attempt budget, due now; same NotificationId, audited."""
    now = now or timezone.now()
    result = TriageResult()
    with transaction.atomic():
        rows, missing = _locked(ids)
        for pk in missing:
            result.refused[uuid.UUID(pk)] = "no such notification"
        for row in rows:
            if row.dead_lettered_at is None:
                result.refused[row.pk] = f"not a dead letter (status {row.status})"
                continue
            DeadLetterAction.objects.create(
                notification=row, action=DeadLetterAction.Action.REQUEUE, actor=actor, reason=reason,
                attempts_before=row.attempts, created_at=now,
            )
            NotificationEntity.objects.filter(pk=row.pk).update(
                attempts=0,
                requeue_count=row.requeue_count + 1,
                dead_lettered_at=None,
                dead_letter_reason="",
                resolution="",
                resolved_at=None,
                next_attempt_at=now,
                updated_at=now,
            )
            result.done.append(row.pk)
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
        for row in rows:
            if row.dead_lettered_at is None:
                result.refused[row.pk] = f"not a dead letter (status {row.status})"
                continue
            if row.resolution == NotificationEntity.Resolution.DISCARDED:
                result.refused[row.pk] = "already discarded"
                continue
            DeadLetterAction.objects.create(
                notification=row, action=DeadLetterAction.Action.DISCARD, actor=actor, reason=reason,
                attempts_before=row.attempts, created_at=now,
            )
            NotificationEntity.objects.filter(pk=row.pk).update(
                resolution=NotificationEntity.Resolution.DISCARDED, resolved_at=now, updated_at=now
            )
            result.done.append(row.pk)
    return result


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
                notification=row, action=DeadLetterAction.Action.EXPIRE, actor="system",
                reason=f"unresolved for more than {retention}", attempts_before=row.attempts, created_at=now,
            )
            for row in rows
        )
        NotificationEntity.objects.filter(pk__in=[r.pk for r in rows]).update(
            resolution=NotificationEntity.Resolution.UNRESOLVABLE, resolved_at=now, updated_at=now
        )
    return len(rows)
