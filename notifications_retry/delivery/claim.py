"""Claim: one short transaction that leases due rows (``FOR UPDATE SKIP LOCKED``) for sending.

The attempt is counted and a lease (token + expiry) recorded, the status left as it is; the provider
is then called with no transaction open. Rows whose budget is already spent or whose deadline passed,
and rows to a suppressed recipient (one lookup per batch, :mod:`.suppression`), are settled terminal
in the same transaction, without a provider call or a counted attempt (see :mod:`..outcomes`).

A row the claim cannot read or lease (a value Python cannot hold, a state the triggers refuse) is
set aside: the batch is claimed again row by row, and the offending row is reported and skipped from
then on, so one poison row never stops the healthy rows beside it.

A claim reads at most about :data:`CLAIM_PAYLOAD_BYTES` of payloads, whatever its row limit: the rows
past that stay due (their payloads are not even read) and are claimed next, so memory follows this
budget, not ``CLAIM_CHUNK_SIZE`` times ``MAX_PAYLOAD_BYTES``.

The claim's statements are written once, as data (:mod:`.session`): :func:`claim_due` runs them on
Django's connection, :func:`claim_due_async` on an asynchronous psycopg connection (the worker's claims
of asynchronous channels, awaited while the calls in flight go on). What goes wrong there is redone
through :func:`claim_due`, whose fallbacks (a poison row claimed alone, an outage told from a refused
row) are written once, here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import structlog
from django.db import DatabaseError, connection, transaction
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import get_settings
from notifications_retry.delivery.claim_statements import (
    CLAIM_PAYLOAD_BYTES,
    CLAIM_UPDATE,
    ChannelClaim,
    ClaimRequest,
    Partitions,
    TenantCaps,
    claim_query,
    lapsed_leases_query,
    recovery_group,
    set_aside,
)
from notifications_retry.delivery.finalize import connection_lost, outcome_steps, reachable
from notifications_retry.delivery.session import (
    Statement,
    Steps,
    bound_transaction,
    bounded,
    run_steps,
    run_transaction_async,
)
from notifications_retry.delivery.suppression import suppressed_steps
from notifications_retry.exceptions import first_line
from notifications_retry.rules.outcomes import (
    TERMINAL,
    UNDECODABLE,
    ClaimedRecord,
    Failure,
    Outcome,
    attempt_budget,
    before_send,
)

#: Used when the caller passes no logger of its own (the worker passes its tick's, with job_run_id and lane).
default_log = structlog.get_logger("notifications_retry.delivery")


@dataclasses.dataclass
class ClaimBatch:
    """Rows leased for sending, rows settled inside the claim, and rows set aside as poison."""

    records: list[ClaimedRecord]
    settled: list[Outcome]
    #: True when due rows were left for the next claim on purpose (recovered leases are claimed apart,
    #: rows past the payload budget wait for the next claim).
    more: bool = False
    #: Rows the claim could not read or lease, with the database's reason.
    poisoned: dict[uuid.UUID, str] = dataclasses.field(default_factory=dict)


Settle = Callable[[ClaimedRecord], Outcome | None]


def claim_due(
    request: ClaimRequest, *, settle: Settle | None = None, log: FilteringBoundLogger | None = None
) -> ClaimBatch:
    """Lease up to ``request.total`` due rows (oldest due first), at most ``limit`` per channel of its plan.

    ``settle`` may deliver a record on the spot: it is called for each claimable record (its
    ``attempts`` already counting this attempt) and returns an outcome, or None to lease the record.
    Only for providers that do no I/O (``Provider.inline``): a settled record is finalized in this same
    short transaction, with no lease, so a no-op drain writes each row once, not twice. If writing those
    outcomes fails, the claim is redone without ``settle``, so the usual per-record finalize isolates the
    bad row. ``log`` (a structlog logger) says when the claim falls back (``claim-fallback``); the worker
    passes its tick's.
    """
    log = log if log is not None else default_log
    plan = [p for p in request.plan if p.limit > 0]
    total = request.total
    if not plan or total <= 0:
        return ClaimBatch([], [])
    claim = _Claim(request)
    if settle is not None:
        delivered = 0

        def counted(record: ClaimedRecord) -> Outcome | None:
            nonlocal delivered
            outcome = settle(record)
            delivered += outcome is not None
            return outcome

        try:
            return claim.run(plan, total, counted)
        except DatabaseError as exc:
            if connection_lost(exc) and not reachable():
                raise
            if delivered:
                # Writing the outcomes failed, not the claim: lease instead, and let the usual
                # per-record finalize isolate the bad row.
                log.warning("claim-fallback", fallback="leases", outcomes=delivered, error=first_line(exc))
            else:
                return claim.isolate(plan, total, exc, log)
    try:
        return claim.run(plan, total, None)
    except DatabaseError as exc:
        if connection_lost(exc) and not reachable():
            raise
        return claim.isolate(plan, total, exc, log)


async def claim_due_async(
    conn: psycopg.AsyncConnection[tuple[object, ...]], request: ClaimRequest, *, settle: Settle | None = None
) -> ClaimBatch:
    """Lease up to ``request.total`` due rows on ``conn`` as :func:`claim_due` does, ``settle``
    included (the settled rows' events written by ``COPY``); raises what psycopg raised, or
    :class:`~notifications_retry.delivery.finalize.NeedsDjango` (``outcome_steps``), the transaction
    rolled back: the caller redoes the claim through :func:`claim_due`."""
    plan = [p for p in request.plan if p.limit > 0]
    if not plan or request.total <= 0:
        return ClaimBatch([], [])
    claim = _Claim(request, server_version=conn.info.server_version)
    steps = bounded(claim.steps(plan, request.total, settle, orm=False))
    return await run_transaction_async(conn, steps, copy=settle is not None)


class _Claim:
    """One claim's parameters and the rows it read."""

    def __init__(self, request: ClaimRequest, server_version: int | None = None) -> None:
        self.now = request.now
        self.server_version = server_version
        self.partitions = request.partitions
        self.budgets = request.budgets
        self.by_type = request.attempts_by_type
        self.priorities = request.priorities
        self.skip = set(request.skip)
        if request.max_payload_bytes is None:
            self.max_payload_bytes = get_settings().MAX_PAYLOAD_BYTES
        else:
            self.max_payload_bytes = request.max_payload_bytes
        #: Why each row of the batch in hand is suppressed (one lookup per batch, in the claim).
        self.suppressed: Mapping[uuid.UUID, str] = {}

    def query(
        self, plan: Sequence[ChannelClaim], total: int, only: uuid.UUID | None = None
    ) -> tuple[str, dict[str, Any]]:
        return claim_query(
            self.now,
            plan,
            total=total,
            priorities=self.priorities,
            skip=self.skip,
            only=only,
            max_payload_bytes=self.max_payload_bytes,
            partitions=self.partitions,
            server_version=self.server_version,
        )

    def lapsed(
        self, plan: Sequence[ChannelClaim], only: uuid.UUID | None = None, *, ids: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """The give-back of the plan's lapsed leases (:mod:`.claim_statements`)."""
        channels = [p.channel_id for p in plan]
        return lapsed_leases_query(
            self.now, channels, skip=self.skip, partitions=self.partitions, only=only, ids=ids
        )

    def run(
        self, plan: Sequence[ChannelClaim], total: int, settle: Settle | None, only: uuid.UUID | None = None
    ) -> ClaimBatch:
        with transaction.atomic(), connection.cursor() as cursor:
            bound_transaction(cursor)
            return run_steps(self.steps(plan, total, settle, only), cursor)

    def steps(
        self,
        plan: Sequence[ChannelClaim],
        total: int,
        settle: Settle | None,
        only: uuid.UUID | None = None,
        *,
        orm: bool = True,
    ) -> Steps[ClaimBatch]:
        """The claim's statements (delivery.session), inside the caller's bounded transaction
        (``orm``: as :func:`~notifications_retry.delivery.finalize.outcome_steps` takes it)."""
        token = uuid.uuid4()
        sql, params = self.query(plan, total, only)
        records: list[ClaimedRecord] = []
        settled: list[Outcome] = []
        yield Statement(*self.lapsed(plan), rows=False)
        fetched = yield Statement(sql, params)
        # Rows past the payload budget stay due, unleased: the next claim takes them.
        within = [row for row in fetched if not row[_OVER_BUDGET]]
        rows, more = recovery_group(within, _RECOVERED, _CRASHES)
        more = more or len(within) < len(fetched)
        self.suppressed = yield from suppressed_steps(
            [(row[0], self.budgets[row[2]][1], row[3]) for row in rows], self.now
        )
        ids: list[str] = []
        leases: list[str] = []
        for row in rows:
            record, lease, stop = self._record(row)
            if stop is not None:
                settled.append(Outcome(record, TERMINAL, error_kind=stop.kind, error=stop.error))
                continue
            record.attempts += 1
            outcome = settle(record) if settle is not None else None
            if outcome is not None:
                settled.append(outcome)
                continue
            record.claim_token = token
            record.lease_expires_at = self.now + timedelta(seconds=lease)
            ids.append(record.id_text)
            leases.append(repr(lease))
            records.append(record)
        if ids:
            leased = {"token": token, "now": self.now, "ids": ",".join(ids), "leases": ",".join(leases)}
            yield Statement(CLAIM_UPDATE, leased, rows=False)
        if settled:
            yield from outcome_steps(settled, self.now, guarded=False, orm=orm)
        return ClaimBatch(records, settled, more)

    def _record(self, row: Sequence[Any]) -> tuple[ClaimedRecord, float, Failure | None]:
        """The claimed record of a row, its lease length, and what stops it before a send (if anything)."""
        nid, tenant, channel_id, recipient, payload, ntype, priority, status, attempts = row[:9]
        expires_at, correlation_id, requeue_count, lease = row[9:13]
        # One undecodable payload (nested past Python's recursion limit) must not fail the claim
        # of every row with it, tick after tick: it is settled as terminal instead.
        undecodable = ""
        try:
            payload = _json(payload)
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
        if undecodable:
            stop = Failure(UNDECODABLE, f"payload cannot be decoded: {undecodable}", retriable=False)
            return record, float(lease), stop
        shape, text_size, recipient_chars = row[_MEASURES:]
        aside = set_aside(
            shape=shape,
            text_size=text_size,
            recipient_chars=recipient_chars,
            payload=payload,
            max_payload=self.max_payload_bytes,
        )
        if aside is not None:
            return record, float(lease), aside
        max_attempts, channel_key = self.budgets[channel_id]
        budget = attempt_budget(max_attempts, channel_key, ntype, self.by_type)
        return (
            record,
            float(lease),
            before_send(
                attempts_done=attempts,
                budget=budget,
                expires_at=expires_at,
                now=self.now,
                suppressed=self.suppressed.get(nid),
            ),
        )

    def isolate(
        self, plan: Sequence[ChannelClaim], total: int, cause: BaseException, log: FilteringBoundLogger
    ) -> ClaimBatch:
        """The batch failed as a whole: give lapsed leases back one by one, then claim the due rows one
        by one, and set aside the rows that fail alone (the give-back runs first in every claim, so a
        lapsed row it cannot write would fail every claim too)."""
        with connection.cursor() as cursor:
            cursor.execute(*self.lapsed(plan, ids=True))
            lapsed = [row[0] for row in cursor.fetchall()]
        batch = ClaimBatch([], [])
        for nid in lapsed:
            with self._alone(nid, batch), transaction.atomic(), connection.cursor() as cursor:
                bound_transaction(cursor)
                cursor.execute(*self.lapsed(plan, only=nid))
        with connection.cursor() as cursor:
            sql, params = self.query(plan, total)
            # Ids only: reading the other columns is what may have failed.
            unlocked = sql.replace("FOR UPDATE OF t SKIP LOCKED", "")
            cursor.execute(f"SELECT id FROM ({unlocked}) AS due", params)
            candidates = [row[0] for row in cursor.fetchall()]
        rows = len(lapsed) + len(candidates)
        log.warning("claim-fallback", fallback="row-by-row", rows=rows, error=first_line(cause))
        for nid in candidates:
            with self._alone(nid, batch):
                one = self.run(plan, 1, None, only=nid)
                batch.records += one.records
                batch.settled += one.settled
        return batch

    @contextlib.contextmanager
    def _alone(self, nid: uuid.UUID, batch: ClaimBatch) -> Iterator[None]:
        """A statement on one row: if the database refuses it, the row is set aside (skipped from then
        on); an outage is raised."""
        try:
            yield
        except DatabaseError as exc:
            if connection_lost(exc) and not reachable():
                raise
            batch.poisoned[nid] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            self.skip.add(nid)


_RECOVERED, _CRASHES, _OVER_BUDGET, _MEASURES = 13, 14, 15, 16


def _json(value: Any) -> Any:
    # The standard library's decoder, not orjson's: orjson reads an integer past 64 bits as a float, and
    # a payload's order number of 30 digits must reach the provider as it was stored.
    return json.loads(value) if isinstance(value, str | bytes) else value


__all__ = [
    "CLAIM_PAYLOAD_BYTES",
    "ChannelClaim",
    "ClaimBatch",
    "ClaimRequest",
    "Partitions",
    "TenantCaps",
    "claim_due",
    "claim_due_async",
    "claim_query",
]
