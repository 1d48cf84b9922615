"""Rows whose times Python's datetime cannot hold: set aside as dead letters, their times cleared.

PostgreSQL stores 'infinity', '-infinity' and years past 9999, which raw SQL (or other code) can write
and the API cannot; psycopg refuses to read them ("timestamp too large"). A Pending or Failed row
whose ``next_attempt_at``, ``scheduled_at`` or ``expires_at`` is such a time would wait with no reason
recorded (its due time never comes, ``triggers.DUE_AT_RULE``), and every page or query that loads it
(the admin's list and change page, the API's functions, triage, recovery) would fail on it.

So, like the rows the claim sets aside as poison (:mod:`.claim_statements`), such a row becomes a dead letter
that says why: error kind ``unreadable_time``, one ``dispatched`` (Failed) event, no provider call,
no attempt counted. In the same transaction its unreadable times are set to NULL, so every page can
load it and an operator can requeue it. The database's rules allow both writes: the outcome is
written as the claim writes one (:func:`.finalize.outcome_steps`, a Pending or Failed row becoming a
terminal Failed one), and a dead letter's times may change (only its dead-letter state and a Sent
row's delivery state are fixed).

What "cannot hold" means is compared in SQL, and only readable columns are read: a time before
0001-01-02 or after 9999-12-30 (the bounds the claim and the worker's wait clamp to, a day inside
datetime's range so that any session time zone stays within it). Leased rows are left to their
lease, dead letters and Sent rows are not touched. Each batch is one short transaction whose rows are
locked ``FOR UPDATE SKIP LOCKED``: a claim holding one of them goes on undisturbed.

Two passes find them. :func:`due_ends` reads the two ends of the due index (``nr_due_idx``): a row
whose due time is unreadable (a Failed row's ``next_attempt_at``, a Pending row's ``scheduled_at``),
a few index pages whatever the backlog; every worker runs it at its first loop turn and every
minute. :func:`everywhere` also finds an unreadable deadline, or a time of a column the row's status
does not wait on; it reads every row that is not Sent (the partial index ``nr_status_created_idx``),
and housekeeping runs it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from datetime import datetime

import structlog
from django.db import connection, transaction

from notifications_retry.delivery.finalize import outcome_steps
from notifications_retry.delivery.session import Statement, Steps, bound_transaction, run_steps
from notifications_retry.models import NotificationEntity
from notifications_retry.rules.outcomes import TERMINAL, UNREADABLE_TIME, ClaimedRecord, Failure, Outcome

log = structlog.get_logger("notifications_retry.delivery")

#: The columns held to datetime's range, in the order the messages name them.
COLUMNS = ("next_attempt_at", "scheduled_at", "expires_at")
#: The readable range: what the claim and the wait clamp to (a day inside datetime's own).
EARLIEST = "0001-01-02 00:00+00"
LATEST = "9999-12-30 00:00+00"
#: Rows one transaction sets aside at most.
BATCH_ROWS = 500

_TABLE = NotificationEntity._meta.db_table
_SENT = NotificationEntity.Status.SENT.value


def _outside(column: str) -> str:
    return f"(t.{column} < '{EARLIEST}'::timestamptz OR t.{column} > '{LATEST}'::timestamptz)"


_ANY_OUTSIDE = " OR ".join(_outside(c) for c in COLUMNS)
#: The due index's two ends: index ranges of ``nr_due_idx`` (a due time is never NULL there).
_DUE_ENDS = f"(t.due_at < '{EARLIEST}'::timestamptz OR t.due_at > '{LATEST}'::timestamptz)"

# Only columns Python can read; an unreadable time is read as text (the value, for the message).
_SELECT = f"""
SELECT t.id, t.tenant_id, t.channel_id, t.notification_type, t.priority, t.status, t.attempts,
       t.correlation_id, t.requeue_count,
       {", ".join(f"CASE WHEN {_outside(c)} THEN t.{c}::text END" for c in COLUMNS)}
FROM {_TABLE} t
WHERE {{where}} AND t.status <> '{_SENT}' AND t.dead_lettered_at IS NULL
  AND t.claim_token IS NULL AND t.claim_expires_at IS NULL AND ({_ANY_OUTSIDE})
LIMIT %(limit)s
FOR UPDATE OF t SKIP LOCKED
"""

# After the outcome (the row is a dead letter then, with no due time: no wake-up is sent). Finalize
# clamped an unreadable deadline to its bound already; it is cleared here all the same.
_CLEAR = f"""
UPDATE {_TABLE} t
SET {", ".join(f"{c} = CASE WHEN v.{c} THEN NULL ELSE t.{c} END" for c in COLUMNS)}
FROM unnest(%(ids)s::uuid[], {", ".join(f"%({c})s::bool[]" for c in COLUMNS)}) AS v(id, {", ".join(COLUMNS)})
WHERE t.id = v.id
"""


@dataclasses.dataclass(frozen=True)
class SetAside:
    """A row set aside: its id and its unreadable times, by column (as PostgreSQL prints them)."""

    id: uuid.UUID
    times: dict[str, str]


def unreadable_time(times: dict[str, str]) -> Failure:
    """Why a row whose ``times`` (column: value as stored) Python cannot read is a dead letter."""
    named = ", ".join(f"{column} is '{value}'" for column, value in times.items())
    return Failure(
        UNREADABLE_TIME,
        f"{named}: outside what the app can hold ({EARLIEST[:10]} to {LATEST[:10]}), so it was written "
        "past the API; nothing was sent, and the time was cleared (requeue the row to send it)",
        retriable=False,
        ambiguous=False,
    )


def batch_query(*, due_only: bool) -> str:
    """A batch's ``SELECT … FOR UPDATE SKIP LOCKED`` (its parameter: ``limit``)."""
    return _SELECT.format(where=_DUE_ENDS if due_only else "true")


def _batch_steps(now: datetime, due_only: bool, limit: int) -> Steps[list[SetAside]]:
    rows = yield Statement(batch_query(due_only=due_only), {"limit": limit})
    outcomes: list[Outcome] = []
    found: list[SetAside] = []
    for row in rows:
        nid, tenant, channel_id, ntype, priority, status, attempts, correlation_id, requeue_count = row[:9]
        times = {c: v for c, v in zip(COLUMNS, row[9:], strict=True) if v is not None}
        record = ClaimedRecord(
            id=nid,
            tenant_id=tenant,
            channel_id=channel_id,
            recipient=None,
            payload=None,
            notification_type=ntype,
            priority=priority,
            status=status,
            attempts=attempts,
            expires_at=None,
            correlation_id=correlation_id,
            requeue_count=requeue_count,
            claim_token=None,
        )
        why = unreadable_time(times)
        outcomes.append(Outcome(record, TERMINAL, error_kind=why.kind, error=why.error, ambiguous=False))
        found.append(SetAside(nid, times))
    if not outcomes:
        return []
    # Unguarded, as the claim writes the rows it settles: the rows are locked by this transaction.
    applied = yield from outcome_steps(outcomes, now, guarded=False)
    done = {o.record.id for o in applied}
    found = [f for f in found if f.id in done]
    cleared = {"ids": [f.id for f in found], **{c: [c in f.times for f in found] for c in COLUMNS}}
    yield Statement(_CLEAR, cleared, rows=False)
    return found


def set_aside_batch(now: datetime, *, due_only: bool, limit: int = BATCH_ROWS) -> list[SetAside]:
    """One transaction: set aside up to ``limit`` rows with unreadable times (``due_only``: only those
    whose due time is one, found on the due index's ends); returns them."""
    with transaction.atomic(), connection.cursor() as cursor:
        bound_transaction(cursor)
        found = run_steps(_batch_steps(now, due_only, limit), cursor)
    for row in found:
        log.warning(
            "unreadable-time-set-aside",
            notification_id=str(row.id),
            error_kind=UNREADABLE_TIME,
            columns=sorted(row.times),
        )
    return found


def _batches(now: datetime, *, due_only: bool, limit: int) -> Iterator[int]:
    while True:
        found = len(set_aside_batch(now, due_only=due_only, limit=limit))
        yield found
        if found < limit:
            return


def due_ends(now: datetime, *, limit: int = BATCH_ROWS) -> Iterator[int]:
    """Rows whose due time is unreadable, a batch (one transaction) per item: how many were set aside."""
    return _batches(now, due_only=True, limit=limit)


def everywhere(now: datetime, *, limit: int = BATCH_ROWS) -> Iterator[int]:
    """Rows with any unreadable ``next_attempt_at``, ``scheduled_at`` or ``expires_at``, a batch per item."""
    return _batches(now, due_only=False, limit=limit)


__all__ = [
    "BATCH_ROWS",
    "COLUMNS",
    "SetAside",
    "batch_query",
    "due_ends",
    "everywhere",
    "set_aside_batch",
    "unreadable_time",
]
