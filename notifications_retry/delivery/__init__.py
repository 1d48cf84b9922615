"""Claim and finalize: the only code that changes a record's delivery state.

Claim is one short transaction: due rows are locked with ``FOR UPDATE SKIP LOCKED``, the attempt is
counted and a lease (token + expiry) recorded, the status left as it is. The provider is called with
no transaction open. Finalize is another short transaction that applies outcomes only where the
claim token still matches, and writes each final outcome's outbox event with it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pgtrigger
from django.db import DatabaseError, connection, transaction

from notifications_retry import events
from notifications_retry.models import (
    CONTRACT_VERSION,
    DISPATCHED_TOPIC,
    ChannelConfig,
    NotificationEntity,
    Outbox,
)

logger = logging.getLogger(__name__)

SENT = "sent"
RETRY = "retry"
TERMINAL = "terminal"

#: Error kinds the worker assigns itself (providers add their own).
EXHAUSTED = "attempts_exhausted"
EXPIRED = "expired"
UNDECODABLE = "undecodable_payload"

MAX_ERROR_CHARS = 2000

_TABLE = NotificationEntity._meta.db_table
_OUTBOX = Outbox._meta.db_table
_CHANNEL = ChannelConfig._meta.db_table


@dataclasses.dataclass(frozen=True)
class ChannelClaim:
    """How many rows of one channel to claim now, and for how long."""

    channel_id: int
    limit: int
    lease_seconds: float


@dataclasses.dataclass
class ClaimedRecord:
    """A leased record, detached from the ORM; ``attempts`` already counts this attempt."""

    id: uuid.UUID
    tenant_id: uuid.UUID | None
    channel_id: int
    recipient: Any
    payload: Any
    notification_type: str
    priority: int
    status: str
    attempts: int
    expires_at: datetime | None
    correlation_id: str
    requeue_count: int
    claim_token: uuid.UUID | None


@dataclasses.dataclass
class Outcome:
    """What happened to one claimed record, ready to be applied."""

    record: ClaimedRecord
    result: str
    provider_message_id: str | None = None
    error_kind: str = ""
    error: str = ""
    next_attempt_at: datetime | None = None
    duration_ms: float = 0.0
    #: Seconds the provider asked to wait (Retry-After), and whether the failure was temporary.
    retry_after: float | None = None
    retriable: bool = False

    @property
    def emits_event(self) -> bool:
        return self.result in (SENT, TERMINAL)


@dataclasses.dataclass
class ClaimBatch:
    """Rows leased for sending, and rows settled inside the claim (exhausted, expired)."""

    records: list[ClaimedRecord]
    settled: list[Outcome]
    #: True when due rows were left for the next claim on purpose (a recovered lease is claimed alone).
    more: bool = False


@dataclasses.dataclass
class FinalizeReport:
    """Which outcomes were applied, which were stale (lease lost), which failed to commit."""

    applied: list[Outcome] = dataclasses.field(default_factory=list)
    stale: list[Outcome] = dataclasses.field(default_factory=list)
    failed: list[Outcome] = dataclasses.field(default_factory=list)


def attempt_budget(
    channel_max: int, channel_key: str, notification_type: str, by_type: Mapping[str, int]
) -> int:
    """Attempts allowed: ``ATTEMPTS_BY_TYPE["channel:type"]``, else ``["type"]``, else the channel's."""
    if notification_type:
        for key in (f"{channel_key}:{notification_type}", notification_type):
            if key in by_type:
                return int(by_type[key])
    return channel_max


_CLAIM_SELECT = f"""
SELECT n.id, n.tenant_id, n.channel_id, n.recipient, n.payload, n.notification_type, n.priority,
       n.status, n.attempts, n.expires_at, n.correlation_id, n.requeue_count, c.lease,
       n.claim_token IS NOT NULL AS recovered
FROM unnest(%(channels)s::bigint[], %(limits)s::int[], %(leases)s::float8[]) AS c(channel_id, lim, lease)
CROSS JOIN LATERAL (
    SELECT t.* FROM {_TABLE} t
    WHERE t.channel_id = c.channel_id AND t.due_at IS NOT NULL AND t.due_at <= %(now)s {{priority_filter}}
    ORDER BY t.due_at, t.priority
    LIMIT c.lim
    FOR UPDATE OF t SKIP LOCKED
) n
ORDER BY n.due_at, n.priority
LIMIT %(total)s
"""

# Ids and lease lengths travel as comma-joined text: a psycopg array parameter is quoted element by
# element in Python (a datetime costs more than its row's share of the statement).
_CLAIM_UPDATE = f"""
UPDATE {_TABLE} t
SET attempts = t.attempts + 1, claim_token = %(token)s,
    claim_expires_at = %(now)s + v.lease * interval '1 second', updated_at = %(now)s
FROM unnest(string_to_array(%(ids)s, ',')::uuid[], string_to_array(%(leases)s, ',')::float8[])
     AS v(id, lease)
WHERE t.id = v.id
"""


def claim_query(
    now: datetime, plan: Sequence[ChannelClaim], *, total: int, priorities: Sequence[int] | None = None
) -> tuple[str, dict[str, Any]]:
    """The claim's SELECT and its parameters: what :func:`claim_due` runs (and what EXPLAIN checks)."""
    priority_filter = "AND t.priority = ANY(%(priorities)s)" if priorities else ""
    params: dict[str, Any] = {
        "channels": [p.channel_id for p in plan],
        "limits": [p.limit for p in plan],
        "leases": [float(p.lease_seconds) for p in plan],
        "now": now,
        "total": total,
        "priorities": list(priorities or []),
    }
    return _CLAIM_SELECT.format(priority_filter=priority_filter), params


def claim_due(
    now: datetime,
    plan: Sequence[ChannelClaim],
    *,
    total: int,
    budgets: Mapping[int, tuple[int, str]],
    attempts_by_type: Mapping[str, int] | None = None,
    priorities: Sequence[int] | None = None,
    settle: Callable[[ClaimedRecord], Outcome | None] | None = None,
) -> ClaimBatch:
    """Lease up to ``total`` due rows (oldest due first), at most ``limit`` per channel.

    ``budgets`` maps channel id to (max_attempts, key). Rows whose budget is already spent (the
    worker died during their last attempt) or whose deadline passed are settled as terminal in
    the same transaction, without a provider call.

    ``settle`` may deliver a record on the spot: it is called for each claimable record (its
    ``attempts`` already counting this attempt) and returns an outcome, or None to lease the record.
    Only for providers that do no I/O (``Provider.inline``): a settled record is finalized in this
    same short transaction, with no lease, so a no-op drain writes each row once, not twice. If
    writing those outcomes fails, the claim is redone without ``settle``, so the usual per-record
    finalize isolates the bad row.
    """
    plan = [p for p in plan if p.limit > 0]
    if not plan or total <= 0:
        return ClaimBatch([], [])
    if settle is not None:
        delivered = 0

        def counted(record: ClaimedRecord) -> Outcome | None:
            nonlocal delivered
            outcome = settle(record)
            delivered += outcome is not None
            return outcome

        try:
            return _claim(now, plan, total, budgets, attempts_by_type, priorities, counted)
        except DatabaseError:
            if not delivered:
                raise  # nothing was delivered on the spot: the claim itself failed
            logger.warning(
                "writing %d outcomes delivered inside their claim failed; claiming with leases",
                delivered,
                exc_info=True,
            )
            if connection.connection is not None and not connection.is_usable():
                connection.close()  # a lost connection: the retry reconnects
    return _claim(now, plan, total, budgets, attempts_by_type, priorities, None)


def _claim(
    now: datetime,
    plan: Sequence[ChannelClaim],
    total: int,
    budgets: Mapping[int, tuple[int, str]],
    attempts_by_type: Mapping[str, int] | None,
    priorities: Sequence[int] | None,
    settle: Callable[[ClaimedRecord], Outcome | None] | None,
) -> ClaimBatch:
    by_type = attempts_by_type or {}
    token = uuid.uuid4()
    sql, params = claim_query(now, plan, total=total, priorities=priorities)
    records: list[ClaimedRecord] = []
    settled: list[Outcome] = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
            # A row whose lease expired was in flight when a worker died: maybe it killed the worker.
            # Claim it alone, so a poison record cannot take healthy batch-mates down with it again.
            recovered = [row for row in rows if row[-1]]
            more = bool(recovered) and len(rows) > 1
            if recovered:
                rows = recovered[:1]
            ids: list[str] = []
            leases: list[str] = []
            for row in rows:
                (
                    nid,
                    tenant,
                    channel_id,
                    recipient,
                    payload,
                    ntype,
                    priority,
                    status,
                    attempts,
                    expires_at,
                    correlation_id,
                    requeue_count,
                    lease,
                    _recovered,
                ) = row
                # One undecodable payload (nested past Python's recursion limit) must not fail the claim
                # of every row with it, tick after tick: it is settled as terminal instead.
                try:
                    payload, undecodable = _json(payload), ""
                except (ValueError, RecursionError) as exc:
                    payload, undecodable = None, f"{type(exc).__name__}: {str(exc)[:200]}"
                record = ClaimedRecord(
                    id=nid,
                    tenant_id=tenant,
                    channel_id=channel_id,
                    recipient=recipient,
                    payload=payload,
                    notification_type=ntype,
                    priority=priority,
                    status=status,
                    attempts=attempts,
                    expires_at=expires_at,
                    correlation_id=correlation_id,
                    requeue_count=requeue_count,
                    claim_token=None,
                )
                max_attempts, channel_key = budgets[channel_id]
                budget = attempt_budget(max_attempts, channel_key, ntype, by_type)
                if undecodable:
                    settled.append(
                        Outcome(
                            record,
                            TERMINAL,
                            error_kind=UNDECODABLE,
                            error=f"payload cannot be decoded: {undecodable}",
                        )
                    )
                elif attempts >= budget:
                    settled.append(
                        Outcome(
                            record,
                            TERMINAL,
                            error_kind=EXHAUSTED,
                            error=f"attempt budget of {budget} spent (the last attempt never "
                            "finished: the worker stopped or crashed during it)",
                        )
                    )
                elif expires_at is not None and expires_at <= now:
                    settled.append(
                        Outcome(
                            record,
                            TERMINAL,
                            error_kind=EXPIRED,
                            error=f"deadline {expires_at.isoformat()} passed before sending",
                        )
                    )
                else:
                    record.attempts = attempts + 1
                    outcome = settle(record) if settle is not None else None
                    if outcome is not None:
                        settled.append(outcome)
                        continue
                    record.claim_token = token
                    ids.append(str(nid))
                    leases.append(repr(float(lease)))
                    records.append(record)
            if ids:
                cursor.execute(
                    _CLAIM_UPDATE,
                    {"token": token, "now": now, "ids": ",".join(ids), "leases": ",".join(leases)},
                )
        if settled:
            _apply(settled, now, guarded=False)
    return ClaimBatch(records, settled, more)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


# Rows travel as one JSON document: psycopg escapes text arrays element by element in Python (a
# regex per value), which cost more than the statement itself; json.dumps runs in C.
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
    updated_at = %(now)s,
    attempt_log = t.attempt_log || jsonb_build_array(v.log_entry)
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS v(id uuid, token uuid, status text, attempts int, next_attempt_at timestamptz,
          provider_message_id text, last_error text, error_kind text, dead_lettered_at timestamptz,
          dead_letter_reason text, log_entry jsonb),
     {_CHANNEL} c
WHERE t.id = v.id AND (NOT %(guarded)s OR t.claim_token = v.token) AND c.id = t.channel_id
RETURNING t.id, t.tenant_id, t.attempts, t.requeue_count, c.key
"""

_OUTBOX_INSERT = f"""
INSERT INTO {_OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at, published_at)
SELECT gen_random_uuid(), %(topic)s, v.key, %(version)s, v.generation, v.payload, %(now)s, NULL
FROM jsonb_to_recordset(%(rows)s::jsonb) AS v(key text, generation int, payload jsonb)
"""


def _apply(outcomes: Sequence[Outcome], now: datetime, *, guarded: bool) -> list[Outcome]:
    """Write outcomes (and their events) in the caller's transaction; returns those applied."""
    at = now.isoformat()
    sent_status, failed_status = NotificationEntity.Status.SENT.value, NotificationEntity.Status.FAILED.value
    rows: list[dict[str, Any]] = []
    for o in outcomes:
        error = (o.error or "")[:MAX_ERROR_CHARS]
        sent = o.result == SENT
        terminal = o.result == TERMINAL
        next_at = o.next_attempt_at if o.result == RETRY else None
        rows.append(
            {
                "id": str(o.record.id),
                "token": str(o.record.claim_token) if o.record.claim_token else None,
                "status": sent_status if sent else failed_status,
                # The claimed count: unchanged for a leased record, this attempt for one settled in its claim.
                "attempts": o.record.attempts,
                "next_attempt_at": next_at.isoformat() if next_at else None,
                "provider_message_id": o.provider_message_id,
                "last_error": error,
                "error_kind": "" if sent else o.error_kind,
                "dead_lettered_at": at if terminal else None,
                "dead_letter_reason": f"{o.error_kind}: {error}" if terminal else "",
                "log_entry": {
                    "attempt": o.record.attempts,
                    "at": at,
                    "outcome": o.result,
                    # Attempt numbers restart after a requeue: the generation tells the runs apart.
                    "generation": o.record.requeue_count,
                    "error_kind": o.error_kind or None,
                    "error": error[:300] or None,
                    "duration_ms": round(o.duration_ms, 1),
                },
            }
        )
    with connection.cursor() as cursor:
        cursor.execute(_FINALIZE, {"rows": json.dumps(rows), "now": now, "guarded": guarded})
        applied_rows = {row[0]: row for row in cursor.fetchall()}
        applied = [o for o in outcomes if o.record.id in applied_rows]
        with_events = [o for o in applied if o.emits_event]
        if with_events:
            event_rows: list[dict[str, Any]] = []
            for o in with_events:
                _, tenant, attempts, requeue_count, channel_key = applied_rows[o.record.id]
                event_rows.append(
                    {
                        "key": str(o.record.id),
                        "generation": requeue_count,
                        "payload": events.dispatched_payload(
                            notification_id=o.record.id,
                            tenant_id=tenant,
                            channel=channel_key,
                            status=events.SENT if o.result == SENT else events.FAILED,
                            attempts=attempts,
                            provider_message_id=o.provider_message_id,
                            error=(o.error or None) if o.result != SENT else None,
                            error_kind=o.error_kind if o.result != SENT else None,
                            occurred_at=now,
                        ),
                    }
                )
            cursor.execute(
                _OUTBOX_INSERT,
                {
                    "topic": DISPATCHED_TOPIC,
                    "version": CONTRACT_VERSION,
                    "now": now,
                    "rows": json.dumps(event_rows),
                },
            )
    return applied


def finalize(outcomes: Iterable[Outcome], now: datetime) -> FinalizeReport:
    """Apply outcomes under their claim tokens, in bulk; one bad record never fails the others."""
    outcomes = list(outcomes)
    report = FinalizeReport()
    if not outcomes:
        return report
    try:
        with transaction.atomic():
            applied = _apply(outcomes, now, guarded=True)
        _sort(report, outcomes, applied)
        return report
    except DatabaseError:
        logger.warning(
            "bulk finalize of %d outcomes failed; finalizing one by one", len(outcomes), exc_info=True
        )
    for outcome in outcomes:
        try:
            with transaction.atomic():
                applied = _apply([outcome], now, guarded=True)
            _sort(report, [outcome], applied)
        except DatabaseError:
            logger.exception(
                "finalize of notification %s failed; its lease will expire and it will be retried",
                outcome.record.id,
            )
            report.failed.append(outcome)
            if connection.connection is not None and connection.is_usable() is False:
                connection.close()
    return report


_RELEASE = f"""
UPDATE {_TABLE} t
SET attempts = t.attempts - 1, claim_token = NULL, claim_expires_at = NULL
FROM unnest(%s::uuid[], %s::uuid[]) AS v(id, token)
WHERE t.id = v.id AND t.claim_token = v.token
"""

#: Giving back an attempt that never started is not a requeue: the only trigger it must pass by.
_ATTEMPTS_TRIGGER = "notifications_retry.NotificationEntity:nr_attempts_monotonic"


def release(records: Sequence[ClaimedRecord]) -> int:
    """Give back leased records that were never sent (a graceful stop): as they were before the claim.

    Their lease would otherwise strand them until it expires and spend an attempt no provider saw.
    Returns how many rows were released (a lease already taken over is left alone).
    """
    records = [r for r in records if r.claim_token is not None]
    if not records:
        return 0
    with transaction.atomic(), pgtrigger.ignore(_ATTEMPTS_TRIGGER), connection.cursor() as cursor:
        # Positional parameters: pgtrigger.ignore prefixes the statement with its own.
        cursor.execute(_RELEASE, [[r.id for r in records], [r.claim_token for r in records]])
        return int(cursor.rowcount)


def _sort(report: FinalizeReport, outcomes: Sequence[Outcome], applied: Sequence[Outcome]) -> None:
    applied_ids = {o.record.id for o in applied}
    for o in outcomes:
        (report.applied if o.record.id in applied_ids else report.stale).append(o)
