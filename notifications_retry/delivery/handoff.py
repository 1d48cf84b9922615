"""The monolith's own first send, handed over: its outcome recorded by the same rules as the worker's.

A fresh Pending notification (no ``scheduled_at``) belongs to the monolith's dispatcher. When that
dispatcher has tried to send it, :func:`record_attempt` records what happened: Sent, a retry at the
time :func:`~notifications_retry.rules.outcomes.decide` gives (backoff, attempt budget, Retry-After), or a
terminal failure with its dead-letter fields; Sent and terminal outcomes write their outbox event in
the same transaction. :func:`lease_fresh` and :func:`settle_leased` let the app send such a row itself
(``api.send_now``): leased first, so that no one else can send it meanwhile, then settled under the
lease's token.
"""

from __future__ import annotations

import random
import uuid
from datetime import datetime, timedelta

from django.db import transaction

from notifications_retry.conf import get_settings
from notifications_retry.delivery import suppression
from notifications_retry.delivery.finalize import apply_outcomes, finalize
from notifications_retry.exceptions import InvalidTransition
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.rules.outcomes import (
    HANDOFF,
    TERMINAL,
    ClaimedRecord,
    Evidence,
    Failure,
    Outcome,
    attempt_budget,
    before_send,
    decide,
    outcome_of,
)

#: What a hand-over's refusal says it cannot do.
HAND_OVER = "hand over"


def locked_pending(pk: uuid.UUID | str, now: datetime, *, doing: str) -> NotificationEntity:
    """The row, locked (its channel with it), if it is Pending and no worker's lease holds it: what the
    monolith may still change itself (a hand-over, a cancel). Else :class:`InvalidTransition` saying
    why it cannot ``doing`` it: an outcome was recorded already, or a worker is sending it now (changed
    under it, the worker's outcome would race the monolith's)."""
    try:
        row = NotificationEntity.objects.select_for_update().select_related("channel").get(pk=pk)
    except NotificationEntity.DoesNotExist:
        raise InvalidTransition(f"cannot {doing} notification {pk}: no such notification") from None
    if row.status != NotificationEntity.Status.PENDING:
        raise InvalidTransition(f"cannot {doing} notification {pk}: it is {row.status}, not pending")
    if row.claim_token is not None and row.claim_expires_at is not None and row.claim_expires_at > now:
        raise InvalidTransition(f"cannot {doing} notification {pk}: a worker is sending it now")
    return row


def record_of(row: NotificationEntity, attempts: int, token: uuid.UUID | None = None) -> ClaimedRecord:
    """A row as the record an outcome is decided on (``attempts``: this attempt counted)."""
    return ClaimedRecord(
        id=row.pk,
        tenant_id=row.tenant_id,
        channel_id=row.channel_id,
        recipient=row.recipient,
        payload=row.payload,
        notification_type=row.notification_type,
        priority=row.priority,
        status=row.status,
        attempts=attempts,
        expires_at=row.expires_at,
        correlation_id=row.correlation_id,
        requeue_count=row.requeue_count,
        claim_token=token,
    )


def _decided(
    record: ClaimedRecord,
    channel: ChannelConfig,
    failure: Failure | None,
    provider_message_id: str | None,
    now: datetime,
    rng: random.Random,
    evidence: Evidence | None = None,
    duration_ms: float = 0.0,
) -> Outcome:
    conf = get_settings()
    budget = attempt_budget(
        channel.max_attempts, channel.key, record.notification_type, conf.ATTEMPTS_BY_TYPE
    )
    policy = channel.backoff_policy(conf)
    decision = decide(failure, attempts=record.attempts, budget=budget, now=now, policy=policy, rng=rng)
    return outcome_of(
        record,
        decision,
        failure=failure,
        provider_message_id=provider_message_id,
        trigger=HANDOFF,
        evidence=evidence,
        duration_ms=duration_ms,
    )


def record_attempt(
    pk: uuid.UUID | str,
    *,
    failure: Failure | None,
    provider_message_id: str | None,
    now: datetime,
    rng: random.Random,
) -> Outcome:
    """Record the monolith's attempt at a fresh Pending row (``failure`` None: it was delivered)."""
    with transaction.atomic():
        row = locked_pending(pk, now, doing=HAND_OVER)
        record = record_of(row, row.attempts + 1)
        outcome = _decided(record, row.channel, failure, provider_message_id, now, rng)
        # The row is locked by this transaction: no claim token to guard with.
        apply_outcomes([outcome], now, guarded=False)
    return outcome


def settle_suppressed(pk: uuid.UUID | str, *, now: datetime) -> Outcome | None:
    """A fresh Pending row whose recipient is suppressed: terminal ``suppressed`` now, no attempt counted.

    None (and nothing written) when the recipient is not suppressed: the row is then the caller's to send.
    """
    with transaction.atomic():
        row = locked_pending(pk, now, doing=HAND_OVER)
        found = suppression.active(row.recipient, channel=row.channel.key, now=now)
        if found is None:
            return None
        budget = attempt_budget(
            row.channel.max_attempts, row.channel.key, row.notification_type, get_settings().ATTEMPTS_BY_TYPE
        )
        stop = before_send(
            attempts_done=row.attempts,
            budget=budget,
            expires_at=row.expires_at,
            now=now,
            suppressed=suppression.describe(found.reason, found.channel),
        )
        assert stop is not None  # a suppression always stops the send
        outcome = Outcome(record_of(row, row.attempts), TERMINAL, error_kind=stop.kind, error=stop.error)
        apply_outcomes([outcome], now, guarded=False)
    return outcome


def lease_fresh(pk: uuid.UUID | str, *, now: datetime) -> tuple[ClaimedRecord, ChannelConfig]:
    """Lease a fresh Pending row for sending right away (this attempt counted), as a worker's claim does."""
    with transaction.atomic():
        row = locked_pending(pk, now, doing=HAND_OVER)
        token = uuid.uuid4()
        expires = now + timedelta(seconds=row.channel.lease_seconds(get_settings().LEASE_GRACE_SECONDS))
        NotificationEntity.objects.filter(pk=row.pk).update(
            attempts=row.attempts + 1, claim_token=token, claim_expires_at=expires, updated_at=now
        )
        record = record_of(row, row.attempts + 1, token)
        record.lease_expires_at = expires
        return record, row.channel


def settle_leased(
    record: ClaimedRecord,
    channel: ChannelConfig,
    *,
    failure: Failure | None,
    provider_message_id: str | None,
    now: datetime,
    rng: random.Random,
    evidence: Evidence | None = None,
    duration_ms: float = 0.0,
) -> Outcome:
    """Apply the outcome of a send of a row leased by :func:`lease_fresh`, under its token."""
    outcome = _decided(record, channel, failure, provider_message_id, now, rng, evidence, duration_ms)
    report = finalize([outcome], now)
    if not report.applied:
        raise InvalidTransition(
            f"notification {record.id}: its lease ran out and was taken over before the outcome was recorded"
        )
    return outcome
