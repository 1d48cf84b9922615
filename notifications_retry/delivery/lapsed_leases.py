"""Leases whose worker died: given back by the next claim, and claimed again in halving groups.

A leased row has no ``due_at`` (``triggers.DUE_AT_RULE``): its lease's row version enters none of the
due indexes, and ``nr_lease_expiry_idx`` finds it by its expiry. Every claim (:mod:`.claim`) first gives
back the lapsed leases it could take itself (its channels', its partitions'), in its own transaction,
so that its SELECT sees them due and takes them: no other worker's claim stands between the give-back
and the take.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from notifications_retry.delivery.claim_statements import PARTITION_OF, Partitions
from notifications_retry.models import NotificationEntity

_TABLE = NotificationEntity._meta.db_table

#: Lapsed leases given back per claim at most (a claim after a crash meets at most the rows that were
#: in flight then; what is past this is given back by the next claims).
LAPSED_PER_CLAIM = 1000

# The give-back of lapsed leases, first in the claim's transaction (the claim's SELECT then sees them
# due): the expiry cleared, the token kept, so the claim reads them as recovered (their crashes
# counted, recovery_group below). Only the claim's channels and partitions: a lease another worker
# would take is left to that worker's claim, which gives it back and takes it in one transaction (the
# wake-up wakes every worker at a lease's expiry). Rows another transaction holds (a late outcome
# being written) are skipped. Due from now (DUE_AT_RULE: updated_at).
_LAPSED_IDS = f"""
    SELECT l.id FROM {_TABLE} l
    WHERE l.claim_expires_at IS NOT NULL AND l.claim_expires_at <= %(now)s
          AND l.channel_id = ANY(%(channels)s::bigint[]) AND l.id <> ALL(%(skip)s::uuid[]) {{filters}}
    ORDER BY l.claim_expires_at
    LIMIT {LAPSED_PER_CLAIM}"""
LAPSED_LEASES = f"""
UPDATE {_TABLE} t
SET claim_expires_at = NULL, updated_at = %(now)s, due_at = %(now)s
WHERE t.id IN ({_LAPSED_IDS}
    FOR UPDATE SKIP LOCKED)
"""


def lapsed_leases_query(
    now: datetime,
    channels: Sequence[int],
    *,
    skip: Collection[uuid.UUID] = (),
    partitions: Partitions | None = None,
    only: uuid.UUID | None = None,
    ids: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The give-back of the lapsed leases of ``channels`` (:data:`LAPSED_LEASES`) and its parameters:
    only rows of ``partitions`` (None: every row), none of ``skip`` (rows set aside as poison: a row the
    give-back cannot write must not fail every claim), only ``only`` if given (a give-back row by row,
    ``claim._Claim.isolate``). ``ids``: the SELECT of the rows' ids instead, unlocked."""
    params: dict[str, Any] = {
        "now": now,
        "channels": list(channels),
        "skip": [str(i) for i in skip],
        "only": only,
    }
    filters = "AND l.id = %(only)s" if only is not None else ""
    if partitions is not None and partitions.count > 1:
        filters += f" AND {PARTITION_OF.format(row='l')} = ANY(%(partitions)s)"
        params.update(partition_count=partitions.count, partitions=list(partitions.owned))
    sql = (_LAPSED_IDS if ids else LAPSED_LEASES).format(filters=filters)
    return sql, params


#: Recovered rows whose worker died once with them come back in groups of at most this many.
RECOVERY_GROUP = 16


def recovery_group(rows: list[Any], recovered_at: int, crashes_at: int) -> tuple[list[Any], bool]:
    """The rows to lease now, and whether due rows were left out on purpose (``recovered_at``,
    ``crashes_at``: the positions in a claimed row of its recovered flag and its crash count).

    A row whose lease expired was in flight when its worker died: maybe it killed the worker. Such
    rows come back in groups that halve with each death they were in flight at (16, 8, 4, 2, then
    alone), the rows of fewest deaths first: a recovery drains at the pace of a group's sends, and a
    payload that kills the process is cornered in a few rounds, each costing fewer batch-mates an
    attempt.
    """
    recovered = [row for row in rows if row[recovered_at]]
    if not recovered:
        return rows, False
    least = min(max(1, row[crashes_at] or 1) for row in recovered)
    size = max(1, RECOVERY_GROUP >> (least - 1))
    chosen = [row for row in recovered if max(1, row[crashes_at] or 1) == least][:size]
    return chosen, len(chosen) < len(rows)


__all__ = ["LAPSED_LEASES", "LAPSED_PER_CLAIM", "RECOVERY_GROUP", "lapsed_leases_query", "recovery_group"]
