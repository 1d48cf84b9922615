"""Cancel: the monolith takes back a Pending notification before it is sent."""

from __future__ import annotations

import random
import uuid
from datetime import datetime

from django.db import transaction

from notifications_retry.delivery.finalize import apply_outcomes
from notifications_retry.delivery.handoff import locked_pending, record_of
from notifications_retry.delivery.triage import discard_row
from notifications_retry.models import NotificationEntity
from notifications_retry.rules.backoff import BackoffPolicy
from notifications_retry.rules.outcomes import CANCELLED, TERMINAL, Failure, decide, outcome_of


def cancel(pk: uuid.UUID | str, *, actor: str, reason: str, now: datetime) -> NotificationEntity:
    """Make a Pending notification terminal Failed (``error_kind="cancelled"``) with its Failed event.

    Refused (:class:`InvalidTransition`) for a row that is not Pending or that a worker is sending now.
    """
    with transaction.atomic():
        row = locked_pending(pk, now, doing="cancel")
        error = f"cancelled by {actor}" + (f": {reason}" if reason else "")
        # A cancel is a permanent failure: the same decision as any other (no backoff is consulted).
        failure = Failure(CANCELLED, error, retriable=False)
        decision = decide(
            failure,
            attempts=row.attempts,
            budget=row.channel.max_attempts,
            now=now,
            policy=BackoffPolicy(),
            rng=random.Random(0),
        )
        assert decision.result == TERMINAL
        # The terminal row and its Failed event are written as every outcome's are; the row is locked
        # by this transaction, so no claim token guards the write.
        record = record_of(row, row.attempts)
        apply_outcomes([outcome_of(record, decision, failure=failure)], now, guarded=False)
        # Terminal means dead-lettered in this schema (the worker never takes it again); it is
        # resolved at once so that it does not wait in the triage queue.
        discard_row(row, actor=actor, reason=error, now=now)
        row.refresh_from_db()
    return row
