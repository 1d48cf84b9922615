"""What an ESP reports after a send, applied: the delivery status of a Sent notification, its outbox
event on ``pin.notifications.delivery-status.v1``, and the suppression the report calls for.

A report changes something only when it names a notification this app sent: the notification id
the ``django_email`` provider put in the message's metadata finds the row by primary key, and the row
must be Sent with the provider message id the ESP returned at send time and the report's recipient.
(The provider message id has no index of its own: every Sent row would enter it, for these reports
alone; docs/performance.md, "Where the bytes go".) A report that names none changes nothing (the
receiver logs it).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime

from django.db import transaction

from notifications_retry.delivery import events, suppression
from notifications_retry.inputs.validation import normalize_recipient
from notifications_retry.models import (
    ALL_CHANNELS,
    DELIVERY_STATUS_TOPIC,
    DeliveryStatus,
    NotificationEntity,
    Outbox,
    Suppression,
)

State = DeliveryStatus.State

#: A state's number: the outbox event's generation (each state is announced once per notification)
#: and its rank (a later report of a lower state never replaces a higher one: an open reported after
#: a complaint leaves the complaint).
STATE_NUMBER = {State.DELIVERED: 1, State.OPENED: 2, State.BOUNCED: 3, State.COMPLAINED: 4}

#: Reasons that apply to the address on every channel (the mailbox is gone, or its owner called the
#: mail spam); an unsubscribe applies to the channel it came through.
_EVERY_CHANNEL = {
    Suppression.Reason.HARD_BOUNCE,
    Suppression.Reason.COMPLAINT,
    Suppression.Reason.INVALID_RECIPIENT,
}


@dataclasses.dataclass(frozen=True)
class EspReport:
    """One ESP event, as the app reads it: which message, what became of it, what it calls for."""

    esp: str
    event_type: str
    recipient: str
    message_id: str
    #: The notification id the provider put in the message's metadata, when the ESP echoed it back.
    notification_id: uuid.UUID | None
    #: When the ESP says it happened (None: it did not say).
    at: datetime | None
    #: The delivery state it sets, if any.
    state: str | None = None
    #: The suppression reason it calls for, if any.
    suppress: str | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Applied:
    """What a report changed: the notification it matched (None: it matched none, nothing changed).

    ``matched`` is False for a report that called for nothing (it was not looked up).
    """

    notification_id: uuid.UUID | None
    state_changed: bool = False
    suppression: Suppression | None = None
    matched: bool = True


def apply_report(report: EspReport, *, now: datetime) -> Applied:
    """Apply one ESP report in one short transaction; a report for no notification of ours changes nothing."""
    if report.state is None and report.suppress is None:
        return Applied(None, matched=False)
    with transaction.atomic():
        row = _sent_notification(report)
        if row is None:
            return Applied(None, matched=False)
        changed = report.state is not None and _set_state(row, report, now)
        suppressed = None
        if report.suppress is not None:
            channel = ALL_CHANNELS if report.suppress in _EVERY_CHANNEL else row.channel.key
            suppressed, _ = suppression.record(
                row.recipient,
                channel=channel,
                reason=report.suppress,
                source=report.esp,
                detail=report.detail,
                at=report.at or now,
            )
    return Applied(row.pk, changed, suppressed)


def _sent_notification(report: EspReport) -> NotificationEntity | None:
    if report.notification_id is None or not report.message_id or not report.recipient:
        return None
    row = (
        NotificationEntity.objects.select_for_update(of=("self",))
        .select_related("channel")
        .filter(pk=report.notification_id, status=NotificationEntity.Status.SENT)
        .first()
    )
    if row is None or row.provider_message_id != report.message_id:
        return None
    if normalize_recipient(row.recipient) != normalize_recipient(report.recipient):
        return None
    return row


def _set_state(row: NotificationEntity, report: EspReport, now: datetime) -> bool:
    """Record the state's time; move the current state up to it; announce it once. True if it was new."""
    state = State(str(report.state))
    at = report.at or now
    status = DeliveryStatus.objects.filter(notification=row).first()
    if status is None:
        status = DeliveryStatus(notification=row, state=state, state_at=at)
    elif getattr(status, f"{state.value}_at") is not None:
        return False  # announced already: an ESP retrying its webhook, or a second open
    elif STATE_NUMBER[state] >= STATE_NUMBER[State(status.state)]:
        status.state, status.state_at = state, at
    setattr(status, f"{state.value}_at", at)
    status.esp = report.esp[:64]
    status.updated_at = now
    status.save()
    Outbox(
        topic=DELIVERY_STATUS_TOPIC,
        key=str(row.pk),
        generation=STATE_NUMBER[state],
        payload=events.delivery_status_payload(
            notification_id=row.pk,
            tenant_id=row.tenant_id,
            channel=row.channel.key,
            state=state.value,
            state_at=at,
            esp=report.esp,
            provider_message_id=report.message_id,
            occurred_at=now,
        ),
        created_at=now,
    ).save()
    return True
