"""Finalize: apply outcomes (and their outbox events) in one short transaction under the claim token.

An outcome is applied only where the row's claim token still matches the one its claim recorded: a
lease that expired and was taken over makes the late outcome stale, and it changes nothing. When the
connection itself fails, the outcomes are not lost: :class:`CommitUnavailable` hands them back to the
caller, who keeps them and tries again while their leases hold.

:func:`finalize` commits on Django's connection. :func:`finalize_async` commits the same statements
(:func:`commit_steps`) on an asynchronous psycopg connection, the worker's send loop's; a batch whose
commit writes through Django's ORM (a channel's health change, a gone mailbox's suppression), or
whose statements fail there, raises and is committed by :func:`finalize`, which tells a refused row
from an outage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import psycopg
import structlog
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from notifications_retry.delivery import events, health
from notifications_retry.delivery.session import (
    CopyIn,
    Statement,
    Steps,
    bound_transaction,
    bounded,
    json_document,
    run_steps,
    run_transaction_async,
)
from notifications_retry.delivery.suppression import gone_mailboxes, suppress_gone_mailboxes
from notifications_retry.exceptions import first_line
from notifications_retry.models import (
    CONTRACT_VERSION,
    DISPATCHED_TOPIC,
    ChannelConfig,
    NotificationEntity,
    Outbox,
)
from notifications_retry.rules.event_ids import outbox_event_id
from notifications_retry.rules.outcomes import RETRY, SENT, TERMINAL, ClaimedRecord, Outcome

#: Used when the caller passes no logger of its own (the worker passes its tick's, with job_run_id and lane).
default_log = structlog.get_logger("notifications_retry.delivery")

MAX_ERROR_CHARS = 2000

_TABLE = NotificationEntity._meta.db_table
_OUTBOX = Outbox._meta.db_table
_CHANNEL = ChannelConfig._meta.db_table


@dataclasses.dataclass
class FinalizeReport:
    """Which outcomes were applied, which were stale (lease lost), which failed to commit."""

    applied: list[Outcome] = dataclasses.field(default_factory=list)
    stale: list[Outcome] = dataclasses.field(default_factory=list)
    failed: list[Outcome] = dataclasses.field(default_factory=list)
    #: Channels (ids) the outcomes called that are disabled now: by this commit's health change,
    #: earlier, or by an operator (delivery.health). The worker starts no further call on them.
    disabled: list[int] = dataclasses.field(default_factory=list)


#: A test hook: called inside a bulk finalize's transaction, just before it commits (the process
#: tests freeze the worker there to prove the server ends the transaction). None in production.
BEFORE_COMMIT: Callable[[], None] | None = None


class CommitUnavailable(Exception):
    """The database could not be reached: ``pending`` outcomes were not written; keep them and retry.

    ``report`` holds what was committed before the connection went (one-by-one finalize).
    """

    def __init__(self, reason: str, pending: Sequence[Outcome], report: FinalizeReport | None = None) -> None:
        super().__init__(reason)
        self.pending = list(pending)
        self.report = report or FinalizeReport()


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (no row's fault), not that a row was refused."""
    if isinstance(exc, InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        return connection.connection is None or not connection.is_usable()
    return False


# Rows travel as one JSON document (statements.json_document, written in C): psycopg escapes text
# arrays element by element in Python (a regex per value), which cost more than the statement itself.
_FINALIZE = f"""
UPDATE {_TABLE} t
SET status = v.status,
    attempts = v.attempts,
    next_attempt_at = v.next_attempt_at,
    provider_message_id = COALESCE(v.provider_message_id, t.provider_message_id),
    last_error = v.last_error,
    error_kind = v.error_kind,
    dead_lettered_at = v.dead_lettered_at,
    dead_letter_reason = v.dead_letter_reason,
    claim_token = NULL,
    claim_expires_at = NULL,
    -- triggers.DUE_AT_RULE for the row as written: the trigger then has nothing to correct.
    due_at = CASE WHEN v.status = 'failed' AND v.dead_lettered_at IS NULL
                      THEN COALESCE(v.next_attempt_at, t.created_at)
                  WHEN v.status = 'pending' THEN t.scheduled_at END,
    updated_at = %(now)s,
    -- A deadline Python cannot hold ('-infinity', 'infinity', year 12000) is stored as the bound the
    -- claim read it as: the row can then be loaded (admin, API) and says the same thing.
    expires_at = CASE WHEN t.expires_at < '0001-01-02 00:00+00' THEN '0001-01-02 00:00+00'::timestamptz
                      WHEN t.expires_at > '9999-12-30 00:00+00' THEN '9999-12-30 00:00+00'::timestamptz
                      ELSE t.expires_at END,
    -- Likewise a start time ('-infinity' is due, and claimed as long due).
    scheduled_at = CASE WHEN t.scheduled_at < '0001-01-02 00:00+00' THEN '0001-01-02 00:00+00'::timestamptz
                        WHEN t.scheduled_at > '9999-12-30 00:00+00' THEN '9999-12-30 00:00+00'::timestamptz
                        ELSE t.scheduled_at END,
    -- The attempt's trigger: the outcome's own (a hand-off), else what a requeue left on the row.
    attempt_log = t.attempt_log || jsonb_build_array(
        v.log_entry || jsonb_build_object('trigger', COALESCE(v.trigger, t.next_trigger, 'scheduled'))),
    next_trigger = NULL
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS v(id uuid, token uuid, status text, attempts int, next_attempt_at timestamptz,
          provider_message_id text, last_error text, error_kind text, dead_lettered_at timestamptz,
          dead_letter_reason text, log_entry jsonb, trigger text),
     {_CHANNEL} c
WHERE t.id = v.id AND (NOT %(guarded)s OR t.claim_token = v.token) AND c.id = t.channel_id
RETURNING t.id, t.tenant_id, t.attempts, t.requeue_count, c.key
"""

# The event id is derived from the outcome (event_ids): a second event for it cannot be inserted.
_OUTBOX_INSERT = f"""
INSERT INTO {_OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at, published_at)
SELECT nr_outbox_event_id(%(topic)s, v.key, v.generation), %(topic)s, v.key, %(version)s, v.generation,
       v.payload, %(now)s, NULL
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(key text, generation int, payload jsonb)
"""
# The same rows as a COPY (statements.CopyIn: a WAL record per page of events, not one per event),
# their ids derived here as the database derives them (event_ids); the insert trigger checks each.
_OUTBOX_COPY = (
    f"COPY {_OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at) FROM STDIN"
)


def apply_outcomes(outcomes: Sequence[Outcome], now: datetime, *, guarded: bool) -> list[Outcome]:
    """Write outcomes (and their events) in the caller's transaction; returns those applied."""
    return _apply(outcomes, now, guarded=guarded)[0]


def _apply(outcomes: Sequence[Outcome], now: datetime, *, guarded: bool) -> tuple[list[Outcome], list[int]]:
    """:func:`apply_outcomes`, and the called channels disabled now (by id; delivery.health)."""
    disabled: list[int] = []
    with connection.cursor() as cursor:
        if guarded:  # the claim's own transaction (unguarded) is bounded already
            bound_transaction(cursor)
        applied = run_steps(outcome_steps(outcomes, now, guarded=guarded), cursor)
        # Endpoint health counts these calls in the same transaction (delivery/health.py). Outcomes
        # settled inside their claim (unguarded) come from inline providers, which have no endpoint:
        # counting them would only make two claimers' transactions wait on one bucket row.
        if guarded:
            disabled = health.record(cursor, applied, now)
    return applied, disabled


def outcome_steps(
    outcomes: Sequence[Outcome], now: datetime, *, guarded: bool, orm: bool = True
) -> Steps[list[Outcome]]:
    """The statements that write outcomes and their events (delivery.session); returns those applied.

    ``guarded``: only where the row's claim token is still the outcome's. ``orm``: False on a
    connection of the send loop, where an outcome whose write needs Django's ORM (a gone mailbox's
    suppression) raises :class:`NeedsDjango` before any statement, and the caller writes it there.
    """
    if not orm and gone_mailboxes(outcomes):
        raise NeedsDjango("a gone mailbox is suppressed through Django's ORM")
    at = now.isoformat()
    sent_status, failed_status = NotificationEntity.Status.SENT.value, NotificationEntity.Status.FAILED.value
    rows: list[dict[str, Any]] = []
    # A claim's records share its token: its text is made once a claim, not once a row.
    token: Any = None
    token_text: str | None = None
    for o in outcomes:
        record = o.record
        error = (o.error or "")[:MAX_ERROR_CHARS]
        result = o.result
        sent = result == SENT
        terminal = result == TERMINAL
        next_at = o.next_attempt_at if result == RETRY else None
        if record.claim_token is not token:
            token = record.claim_token
            token_text = str(token) if token else None
        log_entry: dict[str, Any] = {"attempt": record.attempts, "at": at, "outcome": result}
        # Attempt numbers restart after a requeue: the generation tells the runs apart. The first
        # run's (0) is left out, as every key below at its default: a reader takes a missing
        # generation for 0 (docs/events.md).
        if record.requeue_count:
            log_entry["generation"] = record.requeue_count
        log_entry["duration_ms"] = round(o.duration_ms, 1)
        # Only when there is one: the entry is in every row version the WAL carries.
        if o.error_kind:
            log_entry["error_kind"] = o.error_kind
        if error:
            log_entry["error"] = error[:300]
        # A failover: the fallback channel whose provider delivered this attempt.
        if o.delivered_by:
            log_entry["delivered_by"] = o.delivered_by
        # A provider call's answer (its evidence); an outcome decided without a call has none.
        if o.evidence is not None:
            log_entry.update(o.evidence.log_fields())
        rows.append(
            {
                "id": record.id_text,
                "token": token_text,
                "status": sent_status if sent else failed_status,
                # The claimed count: unchanged for a leased record, this attempt for one settled in its claim.
                "attempts": record.attempts,
                "next_attempt_at": next_at.isoformat() if next_at else None,
                "provider_message_id": o.provider_message_id,
                "last_error": error,
                "error_kind": "" if sent else o.error_kind,
                "dead_lettered_at": at if terminal else None,
                "dead_letter_reason": f"{o.error_kind}: {error}" if terminal else "",
                "trigger": o.trigger,
                "log_entry": log_entry,
            }
        )
    written = yield Statement(_FINALIZE, {"rows": json_document(rows), "now": now, "guarded": guarded})
    applied_rows = {row[0]: row for row in written}
    applied = [o for o in outcomes if o.record.id in applied_rows]
    # A permanent reply naming the mailbox as gone puts its address on the suppression list, with
    # the outcome (rare: nothing is asked of the database when no outcome says so). Its writes go
    # through Django's connection: only outcomes of a provider call say so, never a claim's own.
    suppress_gone_mailboxes(applied, now)
    with_events = [o for o in applied if o.emits_event]
    if with_events:
        event_rows: list[dict[str, Any]] = []
        for o in with_events:
            _, tenant, attempts, requeue_count, channel_key = applied_rows[o.record.id]
            event_rows.append(
                {
                    "key": o.record.id_text,
                    "generation": requeue_count,
                    "payload": events.dispatched_payload(
                        notification_id=o.record.id_text,
                        tenant_id=tenant,
                        channel=channel_key,
                        status=events.SENT if o.result == SENT else events.FAILED,
                        attempts=attempts,
                        provider_message_id=o.provider_message_id,
                        error=(o.error or None) if o.result != SENT else None,
                        error_kind=o.error_kind if o.result != SENT else None,
                        occurred_at=now,
                        delivered_by=o.delivered_by if o.result == SENT else None,
                    ),
                }
            )
        topic = {"topic": DISPATCHED_TOPIC, "version": CONTRACT_VERSION}

        def copied() -> list[tuple[Any, ...]]:
            return [
                (
                    outbox_event_id(DISPATCHED_TOPIC, e["key"], e["generation"]),
                    DISPATCHED_TOPIC,
                    e["key"],
                    CONTRACT_VERSION,
                    e["generation"],
                    json_document(e["payload"]),
                    now,
                )
                for e in event_rows
            ]

        yield Statement(
            _OUTBOX_INSERT,
            {**topic, "now": now, "rows": json_document(event_rows)},
            rows=False,
            copy=CopyIn(_OUTBOX_COPY, copied),
        )
    return applied


def finalize(outcomes: Iterable[Outcome], now: datetime, *, log: Any = None) -> FinalizeReport:
    """Apply outcomes under their claim tokens, in bulk; one bad record never fails the others.

    A failed bulk commit is redone one outcome at a time, so a row the database refuses (or whose
    write even ends the connection) is reported in ``failed`` and left leased, while the others
    are applied. Raises :class:`CommitUnavailable` when the database cannot be reached at all. ``log``
    (a structlog logger; the worker passes its tick's) says so: ``finalize-fallback``, ``finalize-failed``.
    """
    log = log if log is not None else default_log
    outcomes = list(outcomes)
    report = FinalizeReport()
    if not outcomes:
        return report
    try:
        with transaction.atomic():
            applied, disabled = _apply(outcomes, now, guarded=True)
            if BEFORE_COMMIT is not None:
                BEFORE_COMMIT()
        _sort(report, outcomes, applied)
        report.disabled = disabled
        return report
    except DatabaseError as exc:
        if connection_lost(exc) and not reachable():
            raise CommitUnavailable(repr(exc), outcomes) from exc
        # One line, no traceback: a database blip must not flood the log.
        log.warning("finalize-fallback", outcomes=len(outcomes), error=first_line(exc))
    for index, outcome in enumerate(outcomes):
        try:
            with transaction.atomic():
                applied, disabled = _apply([outcome], now, guarded=True)
            _sort(report, [outcome], applied)
            report.disabled.extend(c for c in disabled if c not in report.disabled)
        except DatabaseError as exc:
            if connection_lost(exc) and not reachable():
                # What was applied one by one so far is committed; hand back only the rest.
                raise CommitUnavailable(repr(exc), outcomes[index:], report) from exc
            # Its lease will run out and the row will be claimed again.
            log.error("finalize-failed", notification_id=str(outcome.record.id), error=first_line(exc))
            report.failed.append(outcome)
    return report


class NeedsDjango(Exception):
    """A batch whose commit writes through Django's ORM: :func:`finalize` commits it instead."""


def commit_steps(outcomes: Sequence[Outcome], now: datetime) -> Steps[tuple[list[Outcome], list[int]]]:
    """A bulk finalize's statements: the outcomes and their events, the endpoint health window;
    returns the outcomes applied and the called channels found disabled (by id). Raises
    :class:`NeedsDjango` (the transaction then rolls back) where Django's ORM has to write: a
    suppression, a health change."""
    applied = yield from outcome_steps(outcomes, now, guarded=True, orm=False)
    judged = yield from health.window_steps(applied, now)
    if judged.changes:
        raise NeedsDjango("an endpoint's health change is written through Django's ORM")
    return applied, judged.disabled


async def finalize_async(
    conn: psycopg.AsyncConnection[Any], outcomes: Sequence[Outcome], now: datetime
) -> FinalizeReport:
    """Apply outcomes under their claim tokens in one transaction on ``conn`` (in autocommit mode: the
    transaction is explicit, delivery.session). Raises :class:`NeedsDjango` or psycopg's errors, the
    transaction rolled back: the caller commits the batch by :func:`finalize` instead."""
    outcomes = list(outcomes)
    report = FinalizeReport()
    if not outcomes:
        return report
    steps = bounded(commit_steps(outcomes, now))
    applied, disabled = await run_transaction_async(conn, steps, before_commit=BEFORE_COMMIT)
    _sort(report, outcomes, applied)
    report.disabled = disabled
    return report


def reachable() -> bool:
    """After a lost connection: reconnect, and tell whether the database answers at all.

    Tells an outage (keep the outcomes, retry later) from a statement that ended its own
    connection (a poison row: the others can still be committed).
    """
    if connection.in_atomic_block:
        return False
    connection.close()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except DatabaseError:
        connection.close()
        return False


_RELEASE = f"""
UPDATE {_TABLE} t
SET attempts = t.attempts - 1, claim_token = NULL, claim_expires_at = NULL,
    -- Not before the provider's pause (GREATEST ignores a NULL: no pause, the row is due as it was).
    next_attempt_at = CASE WHEN t.status = 'failed' THEN GREATEST(t.next_attempt_at, %(not_before)s)
                           ELSE t.next_attempt_at END,
    scheduled_at = CASE WHEN t.status = 'pending' THEN GREATEST(t.scheduled_at, %(not_before)s)
                        ELSE t.scheduled_at END
FROM unnest(%(ids)s::uuid[], %(tokens)s::uuid[]) AS v(id, token)
WHERE t.id = v.id AND t.claim_token = v.token
"""


def release(records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
    """Give back leased records that were never sent: as they were before the claim.

    Their lease would otherwise strand them until it expires and spend an attempt no provider saw
    (a graceful stop, a circuit that opened, a provider that asked the channel to wait). With
    ``not_before`` (a throttle's Retry-After) their next attempt waits until then: a Failed row's
    ``next_attempt_at``, a Pending row's ``scheduled_at`` move to it if earlier. Returns how many rows
    were released (a lease already taken over is left alone).
    """
    records = [r for r in records if r.claim_token is not None]
    if not records:
        return 0
    # The attempts trigger allows exactly this refund: one less, in the update that clears the lease,
    # status unchanged. No trigger is bypassed; the due-time trigger sets due_at by the new times.
    with transaction.atomic(), connection.cursor() as cursor:
        bound_transaction(cursor)
        cursor.execute(
            _RELEASE,
            {
                "ids": [r.id for r in records],
                "tokens": [r.claim_token for r in records],
                "not_before": not_before,
            },
        )
        return int(cursor.rowcount)


def _sort(report: FinalizeReport, outcomes: Sequence[Outcome], applied: Sequence[Outcome]) -> None:
    applied_ids = {o.record.id for o in applied}
    for o in outcomes:
        (report.applied if o.record.id in applied_ids else report.stale).append(o)
