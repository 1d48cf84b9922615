"""Cancel: the monolith takes back a Pending notification before it is sent."""

from __future__ import annotations

import random
import uuid
from datetime import datetime

from django.db import transaction

from notifications_retry import events
from notifications_retry.exceptions import InvalidTransition
from notifications_retry.models import DeadLetterAction, NotificationEntity
from notifications_retry.outcomes import CANCELLED, TERMINAL, Failure, decide
from notifications_retry.retry import BackoffPolicy


def cancel(pk: uuid.UUID | str, *, actor: str, reason: str, now: datetime) -> NotificationEntity:
    """Make a Pending notification terminal Failed (``error_kind="cancelled"``) with its Failed event.

    Refused (:class:`InvalidTransition`) for a row that is not Pending or that a worker is sending now.
    """
    with transaction.atomic():
        try:
            row = NotificationEntity.objects.select_for_update().select_related("channel").get(pk=pk)
        except NotificationEntity.DoesNotExist:
            raise InvalidTransition(f"cannot cancel notification {pk}: no such notification") from None
        if row.status != NotificationEntity.Status.PENDING:
            raise InvalidTransition(f"cannot cancel notification {pk}: it is {row.status}, not pending")
        if row.claim_token is not None and row.claim_expires_at is not None and row.claim_expires_at > now:
            # The worker is calling the provider right now; cancelling would race the send.
            raise InvalidTransition(f"cannot cancel notification {pk}: a worker is sending it now")
        error = f"cancelled by {actor}" + (f": {reason}" if reason else "")
        # A cancel is a permanent failure: the same decision as any other (no backoff is consulted).
        decision = decide(
            Failure(CANCELLED, error, retriable=False),
            attempts=row.attempts,
            budget=row.channel.max_attempts,
            now=now,
            policy=BackoffPolicy(),
            rng=random.Random(0),
        )
        assert decision.result == TERMINAL
        # Terminal means dead-lettered in this schema (the worker never takes it again); it is
        # resolved at once so that it does not wait in the triage queue.
        NotificationEntity.objects.filter(pk=row.pk).update(
            status=NotificationEntity.Status.FAILED,
            error_kind=decision.error_kind,
            last_error=decision.error,
            next_attempt_at=None,
            claim_token=None,
            claim_expires_at=None,
            dead_lettered_at=now,
            dead_letter_reason=f"{decision.error_kind}: {decision.error}",
            resolution=NotificationEntity.Resolution.DISCARDED,
            resolved_at=now,
            updated_at=now,
        )
        DeadLetterAction.objects.create(
            notification=row,
            action=DeadLetterAction.Action.DISCARD,
            actor=actor,
            reason=error,
            attempts_before=row.attempts,
            created_at=now,
        )
        events.dispatched_event(
            generation=row.requeue_count,
            created_at=now,
            notification_id=row.pk,
            tenant_id=row.tenant_id,
            channel=row.channel.key,
            status=events.FAILED,
            attempts=row.attempts,
            provider_message_id=row.provider_message_id,
            error=error,
            error_kind=decision.error_kind,
        ).save(force_insert=True)
        row.refresh_from_db()
    return row
