"""The suppression list's reads and writes: the claim's one lookup per batch, and every way a row is written.

The claim asks :func:`suppressed_in_batch` once per batch, in its own transaction: one statement on the
``(address, channel)`` unique index for the whole batch, however many rows it holds. A notification
whose recipient is suppressed on its channel (or on ``*``) is then settled terminal ``suppressed`` in
that claim, with no attempt counted and no provider call
(:func:`notifications_retry.rules.outcomes.before_send`).

Rows are written by :func:`record` (an ESP's report, an SMTP reply, the API, the admin): one upsert,
so concurrent reports of one address extend one row (``events`` + 1, the later ``last_event_at``,
the later expiry) instead of failing or duplicating it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet

from notifications_retry.conf import get_settings
from notifications_retry.delivery.session import Statement, Steps, json_document, run_steps
from notifications_retry.inputs.validation import normalize_recipient
from notifications_retry.models import ALL_CHANNELS, Suppression, SuppressionChange
from notifications_retry.rules.outcomes import MAILBOX_UNAVAILABLE, TERMINAL

_TABLE = Suppression._meta.db_table

Reason = Suppression.Reason

#: When two reasons meet on one row, the row keeps the stronger: a complaint is never downgraded to a
#: bounce by a later report, and an operator's manual entry gives way to what the ESP saw.
_STRENGTH = {
    Reason.MANUAL: 1,
    Reason.INVALID_RECIPIENT: 2,
    Reason.HARD_BOUNCE: 3,
    Reason.UNSUBSCRIBED: 4,
    Reason.COMPLAINT: 5,
}

# Recipients travel as one JSON array (statements.json_document, written in C): psycopg quotes the
# elements of a text array in Python.
_LOOKUP = f"""
SELECT s.address, s.channel, s.reason FROM {_TABLE} s
WHERE s.address = ANY(ARRAY(SELECT jsonb_array_elements_text(%(addresses)s::jsonb)))
  AND (s.expires_at IS NULL OR s.expires_at > %(now)s)
"""


def suppressed_in_batch(
    cursor: Any, recipients: Sequence[tuple[uuid.UUID, str, Any]], now: datetime
) -> dict[uuid.UUID, str]:
    """Which of a claimed batch's notifications are suppressed, and why: one statement for the batch.

    ``recipients`` holds (notification id, channel key, recipient). A recipient that is not a string
    (the claim settles such a row otherwise) is never suppressed.
    """
    return run_steps(suppressed_steps(recipients, now), cursor)


def suppressed_steps(
    recipients: Sequence[tuple[uuid.UUID, str, Any]], now: datetime
) -> Steps[dict[uuid.UUID, str]]:
    """:func:`suppressed_in_batch` as statements (delivery.session), for either driver."""
    wanted: dict[uuid.UUID, tuple[str, str]] = {}
    for nid, channel_key, recipient in recipients:
        if isinstance(recipient, str) and recipient:
            wanted[nid] = (normalize_recipient(recipient), channel_key)
    if not wanted:
        return {}
    addresses = sorted({address for address, _ in wanted.values()})
    rows = yield Statement(_LOOKUP, {"addresses": json_document(addresses), "now": now})
    found: dict[tuple[str, str], str] = {(address, channel): reason for address, channel, reason in rows}
    if not found:
        return {}
    suppressed: dict[uuid.UUID, str] = {}
    for nid, (address, channel_key) in wanted.items():
        reason = found.get((address, channel_key)) or found.get((address, ALL_CHANNELS))
        if reason is not None:
            scope = channel_key if (address, channel_key) in found else ALL_CHANNELS
            suppressed[nid] = describe(reason, scope)
    return suppressed


def describe(reason: str, channel: str) -> str:
    """Why a send was stopped, as ``last_error`` says it."""
    return f"recipient is on the suppression list ({reason}, channel {channel})"


def expiry(reason: str, at: datetime, retention: Mapping[str, int] | None = None) -> datetime | None:
    """When a suppression for ``reason`` reported at ``at`` expires: ``SUPPRESSION_RETENTION_DAYS``.

    A reason the setting does not name never expires (complaints and unsubscribes by default).
    """
    days = (get_settings().SUPPRESSION_RETENTION_DAYS if retention is None else retention).get(reason)
    return at + timedelta(days=days) if days else None


_UPSERT = f"""
INSERT INTO {_TABLE} AS s (address, channel, reason, source, detail, first_event_at, last_event_at,
                           events, expires_at)
VALUES (%(address)s, %(channel)s, %(reason)s, %(source)s, %(detail)s, %(at)s, %(at)s, 1, %(expires_at)s)
ON CONFLICT (address, channel) DO UPDATE SET
    reason = CASE WHEN %(strength)s >= (CASE s.reason {{strengths}} ELSE 0 END) THEN EXCLUDED.reason
                  ELSE s.reason END,
    source = EXCLUDED.source,
    detail = EXCLUDED.detail,
    first_event_at = LEAST(s.first_event_at, EXCLUDED.first_event_at),
    last_event_at = GREATEST(s.last_event_at, EXCLUDED.last_event_at),
    events = s.events + 1,
    -- An expiry only moves later: a row that never expires keeps never expiring.
    expires_at = CASE WHEN s.expires_at IS NULL OR EXCLUDED.expires_at IS NULL THEN
                          CASE WHEN %(forced)s THEN EXCLUDED.expires_at END
                      ELSE GREATEST(s.expires_at, EXCLUDED.expires_at) END
RETURNING s.id, (xmax = 0) AS created
""".format(strengths=" ".join(f"WHEN '{r.value}' THEN {n}" for r, n in _STRENGTH.items()))


def record(
    recipient: str,
    *,
    channel: str = ALL_CHANNELS,
    reason: str,
    source: str,
    at: datetime,
    detail: str = "",
    expires_at: datetime | None = None,
    expires_given: bool = False,
) -> tuple[Suppression, bool]:
    """Create or extend the suppression of ``recipient`` on ``channel``; returns it and whether it is new.

    The expiry follows ``SUPPRESSION_RETENTION_DAYS`` unless ``expires_given`` (then ``expires_at``,
    None meaning never, replaces whatever the row had).
    """
    if reason not in _STRENGTH:
        raise ValueError(f"reason must be one of {', '.join(sorted(_STRENGTH))}, got {reason!r}")
    address = normalize_recipient(recipient)
    if not address or not address.strip():
        raise ValueError("a suppression needs a recipient")
    if not isinstance(channel, str) or not channel:
        raise ValueError(f"channel must be a channel key or {ALL_CHANNELS!r}, got {channel!r}")
    params: dict[str, Any] = {
        "address": address,
        "channel": channel,
        "reason": reason,
        "strength": _STRENGTH[Reason(reason)],
        "source": source[:255],
        "detail": detail[:2000],
        "at": at,
        "expires_at": expires_at if expires_given else expiry(reason, at),
        "forced": expires_given,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_UPSERT, params)
        pk, created = cursor.fetchone()
    return Suppression.objects.get(pk=pk), bool(created)


def suppress_gone_mailboxes(outcomes: Sequence[Any], now: datetime) -> int:
    """Suppress, on every channel, the recipients of terminal ``mailbox_unavailable`` outcomes (SMTP 5.1.1…).

    Runs in the caller's transaction (finalize's), so the suppression commits with the outcome.
    """
    gone = gone_mailboxes(outcomes)
    for outcome in gone:
        recipient = outcome.record.recipient
        if isinstance(recipient, str) and recipient.strip():
            error = outcome.error or ""
            record(
                recipient,
                reason=Reason.INVALID_RECIPIENT,
                source=_smtp_source(error),
                detail=error,
                at=now,
            )
    return len(gone)


def gone_mailboxes(outcomes: Sequence[Any]) -> list[Any]:
    """The outcomes whose permanent reply names the mailbox as gone (their recipients get suppressed)."""
    return [o for o in outcomes if o.result == TERMINAL and o.error_kind == MAILBOX_UNAVAILABLE]


_SMTP_REPLY = re.compile(r"^SMTP (\d{3}) at [^:]+: (\d\.\d{1,3}\.\d{1,3})")


def _smtp_source(error: str) -> str:
    """``SMTP 550 5.1.1`` from the provider's ``SMTP 550 at RCPT TO: 5.1.1 No such user here``."""
    match = _SMTP_REPLY.match(error)
    return f"SMTP {match.group(1)} {match.group(2)}" if match else "SMTP reply"


def add(
    recipient: str,
    *,
    channel: str = ALL_CHANNELS,
    reason: str = Reason.MANUAL,
    actor: str,
    note: str = "",
    expires_at: datetime | None = None,
    now: datetime,
) -> Suppression:
    """A suppression added by hand (the API, the admin), with its audit row, in one transaction."""
    with transaction.atomic():
        suppression, _ = record(
            recipient,
            channel=channel,
            reason=reason,
            source=f"operator: {actor}"[:255],
            detail=note,
            at=now,
            expires_at=expires_at if expires_at is not None else expiry(reason, now),
            expires_given=True,
        )
        SuppressionChange.objects.create(
            address=suppression.address,
            channel=suppression.channel,
            action=SuppressionChange.Action.ADD,
            reason=reason,
            actor=actor[:150],
            note=note,
            created_at=now,
        )
    return suppression


def remove(recipient: str, *, channel: str = ALL_CHANNELS, actor: str, note: str = "", now: datetime) -> int:
    """Lift suppressions by hand, audited: ``*`` lifts the address on every channel, a key only its own row.

    Returns how many rows were deleted.
    """
    rows = Suppression.objects.filter(address=normalize_recipient(recipient))
    if channel != ALL_CHANNELS:
        rows = rows.filter(channel=channel)
    return _delete(rows, actor=actor, note=note, now=now)


def remove_entries(pks: Iterable[int], *, actor: str, note: str = "", now: datetime) -> int:
    """Delete exactly these suppression rows (the admin's remove), audited; returns how many."""
    return _delete(Suppression.objects.filter(pk__in=list(pks)), actor=actor, note=note, now=now)


def _delete(rows: QuerySet[Suppression], *, actor: str, note: str, now: datetime) -> int:
    with transaction.atomic():
        removed = list(rows.select_for_update().values_list("pk", "address", "channel", "reason"))
        Suppression.objects.filter(pk__in=[pk for pk, *_ in removed]).delete()
        SuppressionChange.objects.bulk_create(
            SuppressionChange(
                address=address,
                channel=channel,
                action=SuppressionChange.Action.REMOVE,
                reason=reason,
                actor=actor[:150],
                note=note,
                created_at=now,
            )
            for _, address, channel, reason in removed
        )
    return len(removed)


def active(recipient: str, *, channel: str, now: datetime) -> Suppression | None:
    """The suppression that stops a send to ``recipient`` on ``channel`` now (its own, else ``*``)."""
    channels: Iterable[str] = {channel, ALL_CHANNELS}
    rows = (
        Suppression.objects.filter(address=normalize_recipient(recipient), channel__in=channels)
        .exclude(expires_at__lte=now)
        .order_by("-channel")  # a channel's own row before '*'
    )
    return rows.first()


def prune_expired(*, now: datetime) -> int:
    """Delete suppressions whose expiry has passed (housekeeping)."""
    deleted, _ = Suppression.objects.filter(expires_at__lte=now).delete()
    return deleted


__all__ = [
    "active",
    "add",
    "describe",
    "expiry",
    "normalize_recipient",
    "prune_expired",
    "record",
    "remove",
    "remove_entries",
    "suppress_gone_mailboxes",
    "suppressed_in_batch",
]
