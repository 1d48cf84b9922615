"""django-anymail's ``tracking`` signal, read: which ESP events suppress an address, which set a state.

anymail verifies each webhook (its own basic auth or the ESP's signature) before it sends the signal,
and normalizes about 20 ESPs' events into an ``AnymailTrackingEvent``; :func:`read_event` turns one
into an :class:`~notifications_retry.delivery.esp_reports.EspReport` (pure: no database), and
:func:`on_tracking` (connected in ``AppConfig.ready`` when anymail is installed) applies it.

The rules (docs/suppression.md):

* ``delivered`` and ``opened`` set that delivery state;
* ``bounced`` suppresses (``hard_bounce``) and sets ``bounced`` only when the bounce is permanent, as
  the ESP's own event says (Postmark's ``HardBounce``, Mailgun's ``permanent`` severity, Amazon SES's
  ``Permanent`` bounce type, SendGrid's ``bounce`` as against ``blocked``) or, for another ESP, a 5xx
  SMTP reply in the event; a soft bounce or an event that does not say changes nothing;
* ``complained`` suppresses (``complaint``) and sets ``complained``; ``unsubscribed`` suppresses on
  the notification's channel;
* ``rejected`` suppresses only when the ESP says why and that reason is permanent: an invalid
  address, an earlier bounce, complaint or unsubscribe; a policy block or a timeout does not;
* ``deferred`` and everything else never change anything.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

import structlog

from notifications_retry.conf import get_settings
from notifications_retry.delivery.esp_reports import EspReport, apply_report
from notifications_retry.observability.masking import mask_recipient
from notifications_retry.providers.django_email import TRACKING_METADATA_KEY
from notifications_retry.runtime.clock import default_clock

log = structlog.get_logger("notifications_retry.tracking")

#: The metadata key the ``django_email`` provider sends with each message (ESPs echo metadata back).
METADATA_KEY = TRACKING_METADATA_KEY
#: The receiver's name on anymail's ``tracking`` signal (``AppConfig.ready`` connects it once by it).
DISPATCH_UID = "notifications_retry.tracking"

_REJECT_REASONS = {
    "invalid": "invalid_recipient",
    "bounced": "hard_bounce",
    "spam": "complaint",
    "unsubscribed": "unsubscribed",
}

# A reply code at the start of the text or after a space ("smtp; 550 5.1.1 …"), or an enhanced status.
_SMTP_CODE = re.compile(r"(?:^|[\s;:(])([245])(?:\d\d(?=[\s\-])|\.\d{1,3}\.\d{1,3})")


def smtp_class(text: str | None) -> str | None:
    """The class ("2", "4" or "5") of the first SMTP reply code or enhanced status code in ``text``."""
    match = _SMTP_CODE.search(text or "")
    return match.group(1) if match else None


def _get(mapping: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(mapping, Mapping):
            return None
        mapping = mapping.get(key)
    return mapping


def permanent_bounce(
    esp_name: str, esp_event: Any, mta_response: str | None, description: str | None
) -> bool:
    """Whether a ``bounced`` event is a permanent bounce, as the ESP's own event says."""
    esp = esp_name.lower()
    if esp == "postmark":
        return _get(esp_event, "Type") in ("HardBounce", "BadEmailAddress")
    if esp == "mailgun":
        severity = _get(esp_event, "event-data", "severity")
        if severity is not None:
            return bool(severity == "permanent")
    if esp == "amazon ses":
        bounce_type = _get(esp_event, "bounce", "bounceType")
        if bounce_type is not None:
            return bool(bounce_type == "Permanent")
    if esp == "sendgrid":
        kind = _get(esp_event, "type")
        if kind is not None:
            return bool(kind == "bounce")
    return smtp_class(mta_response) == "5" or (mta_response is None and smtp_class(description) == "5")


def read_event(event: Any, esp_name: str) -> EspReport:
    """The report an ``AnymailTrackingEvent`` makes: the state it sets and the suppression it calls for."""
    event_type = str(event.event_type or "")
    state: str | None = None
    suppress: str | None = None
    if event_type in ("delivered", "opened"):
        state = event_type
    elif event_type == "complained":
        state, suppress = "complained", "complaint"
    elif event_type == "unsubscribed":
        suppress = "unsubscribed"
    elif event_type == "bounced":
        if permanent_bounce(esp_name, event.esp_event, event.mta_response, event.description):
            state, suppress = "bounced", "hard_bounce"
    elif event_type == "rejected":
        suppress = _REJECT_REASONS.get(str(event.reject_reason or ""))
    detail = " ".join(str(part) for part in (event.description, event.mta_response) if part)
    return EspReport(
        esp=esp_name,
        event_type=event_type,
        recipient=str(event.recipient or ""),
        message_id=str(event.message_id or ""),
        notification_id=_notification_id(event.metadata),
        at=event.timestamp,
        state=state,
        suppress=suppress,
        detail=detail[:2000],
    )


def _notification_id(metadata: Any) -> uuid.UUID | None:
    value = _get(metadata, METADATA_KEY)
    try:
        return uuid.UUID(str(value)) if value else None
    except ValueError:
        return None


def on_tracking(sender: Any, event: Any, esp_name: str, **kwargs: Any) -> None:
    """The receiver of anymail's ``tracking`` signal: read the event, apply what it calls for.

    A database error propagates: anymail answers the ESP with an error, and the ESP delivers the
    event again later.
    """
    report = read_event(event, esp_name)
    if report.state is None and report.suppress is None:
        return  # deferred, clicked, a soft bounce…: nothing to record
    applied = apply_report(report, now=default_clock(get_settings().CLOCK).now())
    if not applied.matched:
        # Not about a notification of this app: kept in the log for diagnosis, nothing changed.
        log.info(
            "esp-report-unmatched",
            esp=report.esp,
            event_type=report.event_type,
            recipient=mask_recipient(report.recipient),
            provider_message_id=report.message_id,
            notification_id=str(report.notification_id) if report.notification_id else None,
        )
        return
    log.info(
        "esp-report-applied",
        esp=report.esp,
        event_type=report.event_type,
        notification_id=str(applied.notification_id),
        state=report.state if applied.state_changed else None,
        suppressed=applied.suppression.reason if applied.suppression else None,
    )


__all__ = ["DISPATCH_UID", "METADATA_KEY", "on_tracking", "permanent_bounce", "read_event", "smtp_class"]
