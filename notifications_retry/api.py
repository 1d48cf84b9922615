"""The public API for the monolith: create, schedule, cancel, triage, and queue stats.

Its names are public (docs/contract.md); the rows it changes are written by
:mod:`notifications_retry.delivery`.

Every function runs in the caller's transaction when there is one (``transaction.atomic`` nests as
a savepoint), so a notification created while saving an order commits or rolls back with the order.
Work that must only happen once the row is visible to other processes (telling the monolith's own
dispatcher about a fresh notification) is deferred with ``transaction.on_commit``.

Who sends what: a fresh Pending notification (no ``scheduled_at``) belongs to the monolith's main
dispatcher; the retry worker never touches it. A Pending one with ``scheduled_at`` is the worker's
once that time has come, and so is a Failed one whose ``next_attempt_at`` has come.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from django.db import transaction
from django.dispatch import Signal
from django.utils import timezone

from notifications_retry import direct_send
from notifications_retry.conf import bounds
from notifications_retry.delivery import suppression
from notifications_retry.delivery.cancel import cancel
from notifications_retry.delivery.create import create_pending
from notifications_retry.delivery.handoff import record_attempt
from notifications_retry.delivery.triage import TriageResult, discard, requeue
from notifications_retry.inputs import arguments
from notifications_retry.inputs.validation import (
    InvalidArgumentType,
    InvalidNotification,
    check_text,
    validate_notification,
)
from notifications_retry.rules.outcomes import CANCELLED, Failure
from notifications_retry.runtime.clock import default_clock

from .conf import get_settings
from .models import ALL_CHANNELS, Backlog, ChannelConfig, NotificationEntity, StatusRow, Suppression
from .providers import payload_problems

__all__ = [
    "CANCELLED",
    "QueueStats",
    "TriageResult",
    "cancel_notification",
    "create_notification",
    "discard_dead_letters",
    "is_suppressed",
    "notification_created",
    "queue_stats",
    "record_dispatch_failure",
    "record_dispatch_sent",
    "requeue_dead_letters",
    "schedule_notification",
    "send_now",
    "suppress",
    "unsuppress",
]

#: ``error_kind`` of a notification cancelled through :func:`cancel_notification`.

#: Sent on commit of :func:`create_notification` for a fresh (unscheduled) notification, so the
#: monolith's dispatcher never picks up a row that was rolled back. Keyword argument: ``notification``.
notification_created = Signal()

NotificationRef = NotificationEntity | uuid.UUID | str

#: The longest error text and provider message id the API takes (the columns are text; these bound
#: what one call can make every later read carry).
_ERROR_TEXT = 65_536
_MESSAGE_ID = 255


def _channel(channel: ChannelConfig | str) -> ChannelConfig:
    if isinstance(channel, ChannelConfig):
        return channel
    check_text("channel", channel, max_length=ChannelConfig._meta.get_field("key").max_length or 0)
    found = ChannelConfig.objects.filter(key=channel).first()
    if found is None:
        known = list(ChannelConfig.objects.order_by("key").values_list("key", flat=True)[: _KNOWN_SHOWN + 1])
        listed = ", ".join(known[:_KNOWN_SHOWN]) + (", …" if len(known) > _KNOWN_SHOWN else "")
        raise InvalidNotification("channel", f"no channel with key {channel!r} (known: {listed or 'none'})")
    # A disabled channel is accepted: its rows wait untouched until it is enabled again.
    return found


#: How many channel keys an unknown channel's error lists.
_KNOWN_SHOWN = 10


def _sendable(
    channel: ChannelConfig,
    payload: dict[str, Any],
    scheduled_at: datetime | None,
    expires_at: datetime | None,
) -> None:
    """Refuse what could only expire unsent or become a dead letter: the API checks it, not the worker."""
    if expires_at is not None:
        due = scheduled_at or _aware(None)
        if expires_at <= due:
            raise InvalidNotification(
                "expires_at",
                f"{expires_at.isoformat()} is at or before the time the notification is due "
                f"({'send_at' if scheduled_at is not None else 'now'}, {due.isoformat()}): "
                "it would expire unsent",
            )
    problems = payload_problems(channel.provider_key, payload)
    if problems:
        raise InvalidNotification(
            "payload",
            f"cannot be sent on channel {channel.key!r} ({channel.provider_key}): {'; '.join(problems)}",
        )


def create_notification(
    *,
    channel: ChannelConfig | str,
    recipient: str,
    payload: Mapping[str, Any] | None = None,
    tenant_id: uuid.UUID | str | None = None,
    notification_type: str = "",
    priority: int = NotificationEntity.Priority.NORMAL,
    scheduled_at: datetime | None = None,
    expires_at: datetime | None = None,
    correlation_id: str = "",
    notification_id: uuid.UUID | None = None,
    on_commit: Callable[[NotificationEntity], None] | None = None,
) -> NotificationEntity:
    """Store a Pending notification in the caller's transaction; fresh ones are announced on commit.

    Raises ``notifications_retry.inputs.validation.InvalidNotification`` (a ``ValueError`` naming the field),
    with nothing written, for input the database would refuse or beyond ``MAX_PAYLOAD_BYTES`` /
    ``MAX_PAYLOAD_DEPTH``, and for what could never be sent: an unknown channel (``channel``; a
    disabled one is accepted, its rows wait), a payload the channel's provider cannot send
    (``payload``, naming the key: an email without ``subject``), an ``expires_at`` at or before the
    time the notification is due (``expires_at``).
    """
    conf = get_settings()
    channel = _channel(channel)
    payload = validate_notification(
        recipient=recipient,
        payload=payload,
        notification_type=notification_type,
        priority=priority,
        correlation_id=correlation_id,
        max_payload_bytes=conf.MAX_PAYLOAD_BYTES,
        max_payload_depth=conf.MAX_PAYLOAD_DEPTH,
    )
    scheduled_at = arguments.optional_aware_datetime("scheduled_at", scheduled_at)
    expires_at = arguments.optional_aware_datetime("expires_at", expires_at)
    # An int tenant_id would be stored silently as 00000000-…-000000000005: only a UUID is taken.
    tenant_id = arguments.optional_uuid("tenant_id", tenant_id)
    notification_id = arguments.optional_uuid("notification_id", notification_id)
    on_commit = arguments.optional_callable("on_commit", on_commit)
    _sendable(channel, payload, scheduled_at, expires_at)
    notification = create_pending(
        id=notification_id or uuid.uuid4(),
        channel=channel,
        recipient=recipient,
        payload=payload,
        tenant_id=tenant_id,
        notification_type=notification_type,
        priority=priority,
        scheduled_at=scheduled_at,
        expires_at=expires_at,
        correlation_id=correlation_id,
    )
    if scheduled_at is None:
        # Fresh rows are the monolith dispatcher's: hand them over only once they are visible to it.
        def announce() -> None:
            notification_created.send(sender=NotificationEntity, notification=notification)
            if on_commit is not None:
                on_commit(notification)

        transaction.on_commit(announce)
    return notification


def schedule_notification(
    *, channel: ChannelConfig | str, recipient: str, send_at: datetime, **fields: Any
) -> NotificationEntity:
    """Store a Pending notification that the retry worker sends once ``send_at`` has come."""
    # None would store a fresh notification, the dispatcher's, instead of a scheduled one.
    send_at = arguments.aware_datetime("send_at", send_at)
    return create_notification(channel=channel, recipient=recipient, scheduled_at=send_at, **fields)


def cancel_notification(
    notification: NotificationRef, *, actor: str, reason: str = "", now: datetime | None = None
) -> NotificationEntity:
    """Make a Pending notification terminal Failed (``error_kind="cancelled"``) with its Failed event."""
    pk = _pk(notification)
    _actor_and_reason(actor, reason)
    now = arguments.optional_aware_datetime("now", now) or timezone.now()
    return cancel(pk, actor=actor, reason=reason, now=now)


def requeue_dead_letters(
    ids: Iterable[uuid.UUID | str], *, actor: str, reason: str = "", now: datetime | None = None
) -> TriageResult:
    """Give dead letters a fresh attempt budget, due now; audited (the admin's "retry now")."""
    checked = arguments.id_list("ids", ids)
    _actor_and_reason(actor, reason)
    return requeue(checked, actor=actor, reason=reason, now=arguments.optional_aware_datetime("now", now))


def discard_dead_letters(
    ids: Iterable[uuid.UUID | str], *, actor: str, reason: str = "", now: datetime | None = None
) -> TriageResult:
    """Resolve dead letters without sending them; audited."""
    checked = arguments.id_list("ids", ids)
    _actor_and_reason(actor, reason)
    return discard(checked, actor=actor, reason=reason, now=arguments.optional_aware_datetime("now", now))


def _actor_and_reason(actor: object, reason: object) -> None:
    check_text("actor", actor, max_length=_TRIAGE_TEXT, allow_empty=False)
    check_text("reason", reason, max_length=_TRIAGE_TEXT)


#: Longer would only bloat the audit rows; the admin's reason field takes far less.
_TRIAGE_TEXT = 4096


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """The backlog the worker faces and the counts and oldest age by status and channel."""

    backlog: Backlog
    by_status: list[StatusRow]

    def count(self, status: str, channel: str | None = None) -> int:
        """Rows in ``status`` (on ``channel`` when given)."""
        return sum(r.count for r in self.by_status if r.status == status and channel in (None, r.channel))


def queue_stats(now: datetime | None = None) -> QueueStats:
    """Queue health now: due rows, retry backlog, dead letters, counts and max age by status."""
    now = arguments.optional_aware_datetime("now", now) or timezone.now()
    rows = NotificationEntity.objects
    return QueueStats(backlog=rows.backlog(now), by_status=rows.status_breakdown(now))


# -- the monolith's dispatcher hands over ----------------------------------------------------------


def _aware(now: datetime | None) -> datetime:
    return arguments.optional_aware_datetime("now", now) or default_clock(get_settings().CLOCK).now()


def _pk(notification: NotificationRef) -> uuid.UUID:
    if isinstance(notification, NotificationEntity):
        return notification.pk
    if isinstance(notification, uuid.UUID | str):
        return arguments.uuid_of("notification", notification)
    raise InvalidArgumentType(
        "notification", f"must be a NotificationEntity or its UUID, got {type(notification).__name__}"
    )


def record_dispatch_sent(
    notification: NotificationRef, *, provider_message_id: str | None = None, now: datetime | None = None
) -> NotificationEntity:
    """The monolith's dispatcher delivered a fresh Pending notification: it becomes Sent, with its event.

    Refused (:class:`~notifications_retry.exceptions.InvalidTransition`) for an unknown id, a row that
    is not Pending any more, or one a worker is sending now.
    """
    if provider_message_id is not None:
        check_text("provider_message_id", provider_message_id, max_length=_MESSAGE_ID)
    outcome = record_attempt(
        _pk(notification),
        failure=None,
        provider_message_id=provider_message_id,
        now=_aware(now),
        rng=random.Random(),
    )
    return NotificationEntity.objects.get(pk=outcome.record.id)


def record_dispatch_failure(
    notification: NotificationRef,
    *,
    error: str,
    retriable: bool = True,
    error_kind: str = "dispatch_failed",
    retry_after: float | None = None,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> NotificationEntity:
    """The monolith's dispatcher could not deliver a fresh Pending notification: hand it to the worker.

    Decided as the worker decides (:func:`notifications_retry.rules.outcomes.decide`): a temporary failure
    is retried after the channel's backoff (never before ``retry_after`` seconds), within the attempt
    budget; a permanent one, or the last allowed attempt, is a dead letter with its Failed event.
    """
    pk = _pk(notification)
    check_text("error", error, max_length=_ERROR_TEXT, allow_empty=False)
    check_text("error_kind", error_kind, max_length=64, allow_empty=False)
    retriable = arguments.flag("retriable", retriable)
    if retry_after is not None and (
        isinstance(retry_after, bool) or not isinstance(retry_after, int | float)
    ):
        raise InvalidArgumentType(
            "retry_after", f"must be seconds (a number), got {type(retry_after).__name__}"
        )
    if retry_after is not None and not 0 <= retry_after <= 86_400 * 30:
        raise InvalidNotification(
            "retry_after", f"must be seconds between 0 and 30 days, got {retry_after!r}"
        )
    now = _aware(now)
    rng = arguments.optional_rng("rng", rng)
    failure = Failure(error_kind, error, retriable, float(retry_after) if retry_after is not None else None)
    outcome = record_attempt(
        pk, failure=failure, provider_message_id=None, now=now, rng=rng or random.Random()
    )
    return NotificationEntity.objects.get(pk=outcome.record.id)


def send_now(notification: NotificationRef, *, rng: random.Random | None = None) -> NotificationEntity:
    """Send a fresh Pending notification through its channel's provider now, and record the outcome.

    For a dispatcher that has nothing of its own to send with. The row is leased first (no worker or
    second caller can send it meanwhile), the provider is called with no transaction open (calling
    this inside ``transaction.atomic`` is refused), and the outcome is recorded as
    :func:`record_dispatch_sent` / :func:`record_dispatch_failure` would. A recipient on the suppression
    list is not sent to: the row ends terminal ``suppressed`` with no attempt, as in the worker's claim.
    How: :mod:`notifications_retry.direct_send`.
    """
    return direct_send.send_now(_pk(notification), rng=arguments.optional_rng("rng", rng))


# -- the suppression list ----------------------------------------------------------------------------


def _suppression_args(recipient: object, channel: object, reason: object = "manual") -> None:
    """The suppression functions' arguments, by type, before any query (as the other functions')."""
    check_text("recipient", recipient, max_length=bounds.RECIPIENT_MAX_LENGTH)  # empty: suppression says
    check_text("channel", channel, max_length=_CHANNEL_KEY, allow_empty=False)
    check_text("reason", reason, max_length=_CHANNEL_KEY, allow_empty=False)


_CHANNEL_KEY = 64


def _suppression_channel(channel: str) -> str:
    if channel == ALL_CHANNELS:
        return channel
    if not isinstance(channel, str) or not ChannelConfig.objects.filter(key=channel).exists():
        raise ChannelConfig.DoesNotExist(
            f"no channel with key {channel!r} (or {ALL_CHANNELS!r} for every channel)"
        )
    return channel


def suppress(recipient: str, *, channel: str = ALL_CHANNELS, reason: str = "manual") -> Suppression:
    """Stop sending to ``recipient`` on ``channel`` (``*``: every channel); audited as the ``api``'s.

    Notifications already waiting are stopped too: the worker checks the list when it claims them.
    An address already suppressed is extended (its count and last report), never duplicated.
    """
    _suppression_args(recipient, channel, reason)
    return suppression.add(
        recipient, channel=_suppression_channel(channel), reason=reason, actor="api", now=_aware(None)
    )


def unsuppress(recipient: str, *, channel: str = ALL_CHANNELS) -> int:
    """Lift the suppression of ``recipient``: ``*`` on every channel, a key only that channel's own entry.

    Audited as the ``api``'s; returns how many entries were removed.
    """
    _suppression_args(recipient, channel)
    return suppression.remove(recipient, channel=_suppression_channel(channel), actor="api", now=_aware(None))


def is_suppressed(recipient: str, *, channel: str) -> bool:
    """Whether a notification to ``recipient`` on ``channel`` would be stopped now (own entry or ``*``)."""
    _suppression_args(recipient, channel)
    return suppression.active(recipient, channel=channel, now=_aware(None)) is not None
