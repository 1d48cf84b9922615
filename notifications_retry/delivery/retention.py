"""Retention of Sent rows (``SENT_RETENTION_DAYS``, off by default): housekeeping deletes old ones in batches.

A Sent row is final, and the only state no one acts on any more; in-app rows may still be the
monolith's inbox, so nothing is deleted unless the setting asks for it. A row goes with what only it
gives meaning to: its attempt log (a column of the row), its delivery status (what an ESP reported)
and its triage audit (a dead letter requeued, then sent). Its outbox events are not touched: an
unpublished one is still published, published ones go after ``OUTBOX_RETENTION_DAYS``.

No index serves "Sent, last written before X": every Sent row would enter one, on the hot path of
every send (the partial indexes keep Sent rows out on purpose). So a pass walks the primary key in
batches of :data:`SCAN_ROWS` rows, each one short transaction that deletes the batch's old Sent rows:
each batch reads the same number of index entries whether it finds many such rows or none, and a
pass ends after ``rows / SCAN_ROWS`` batches. ``make bench-prune`` measures it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime

from django.db import connection, transaction

from notifications_retry.delivery.session import bound_transaction
from notifications_retry.models import DeadLetterAction, DeliveryStatus, NotificationEntity

#: Rows of the primary key one batch walks (and at most deletes): a batch takes tens of milliseconds.
SCAN_ROWS = 5000

_TABLE = NotificationEntity._meta.db_table
_SENT = NotificationEntity.Status.SENT.value

# The walk reads the batch's rows in primary-key order from ``after`` on; the deletes see the same
# snapshot. The FKs to the row are deferred (checked at commit): its delivery status and triage audit
# go in the same statement, only for the rows actually deleted. The row is deleted only if it is still
# Sent and old (a row is never rewritten once Sent, but the statement says what it deletes).
_BATCH = f"""
WITH scanned AS MATERIALIZED (
    SELECT id, status, updated_at FROM {_TABLE} {{after}} ORDER BY id LIMIT %(scan)s
), gone AS (
    DELETE FROM {_TABLE} t USING scanned s
    WHERE t.id = s.id AND s.status = %(sent)s AND s.updated_at < %(before)s
      AND t.status = %(sent)s AND t.updated_at < %(before)s
    RETURNING t.id
), audit AS (
    DELETE FROM {DeadLetterAction._meta.db_table} WHERE notification_id IN (SELECT id FROM gone)
), reports AS (
    DELETE FROM {DeliveryStatus._meta.db_table} WHERE notification_id IN (SELECT id FROM gone)
)
SELECT (SELECT id FROM scanned ORDER BY id DESC LIMIT 1), (SELECT count(*) FROM scanned),
       (SELECT count(*) FROM gone)
"""


def prune_sent_batch(
    *, older_than: datetime, after: uuid.UUID | None, scan: int = SCAN_ROWS
) -> tuple[int, uuid.UUID | None]:
    """One batch: of the ``scan`` rows after ``after`` (by id; None: from the first), delete the Sent ones
    last written before ``older_than``. Returns (rows deleted, where the next batch starts; None when the
    walk reached the end)."""
    sql = _BATCH.format(after="WHERE id > %(after)s" if after is not None else "")
    params = {"after": after, "scan": scan, "sent": _SENT, "before": older_than}
    with transaction.atomic(), connection.cursor() as cursor:
        bound_transaction(cursor)
        cursor.execute(sql, params)
        last, scanned, deleted = cursor.fetchone()
    return int(deleted), (last if scanned >= scan else None)


def prune_sent_batches(*, older_than: datetime, scan: int = SCAN_ROWS) -> Iterator[int]:
    """A pass over the table, one batch per item: yields how many rows each batch deleted."""
    after: uuid.UUID | None = None
    while True:
        deleted, after = prune_sent_batch(older_than=older_than, after=after, scan=scan)
        yield deleted
        if after is None:
            return


def prune_sent(*, older_than: datetime, scan: int = SCAN_ROWS) -> int:
    """Delete every Sent row last written before ``older_than``, in batches; returns how many."""
    return sum(prune_sent_batches(older_than=older_than, scan=scan))


__all__ = ["SCAN_ROWS", "prune_sent", "prune_sent_batch", "prune_sent_batches"]
