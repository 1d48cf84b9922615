"""The give-back of lapsed leases: a leased row whose worker died is made due again by the next claim.

A leased row has no ``due_at`` (``db_rules.DUE_AT_RULE``): its lease's row version enters none of the
due indexes, and ``nr_lease_expiry_idx`` finds it by its expiry. Every claim (:mod:`.claim`) first gives
back the leases that lapsed, in its own transaction, so that its SELECT sees them due.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from datetime import datetime
from typing import Any

from notifications_retry.models import NotificationEntity

_TABLE = NotificationEntity._meta.db_table

#: Lapsed leases given back per claim at most (a claim after a crash meets at most the rows that were
#: in flight then; what is past this is given back by the next claims).
LAPSED_PER_CLAIM = 1000

# The give-back of lapsed leases, first in every claim's transaction (the claim's SELECT then sees
# them due): the expiry cleared, the token kept, so the claim reads them as recovered (their crashes
# counted, _recovery_group). Any worker's claim gives back any lapsed lease (the rows' own claim then
# takes them): the wake-up wakes every worker at a lease's expiry, whatever its lanes. Rows another
# transaction holds (a late outcome being written) are skipped. Due from now (DUE_AT_RULE: updated_at).
_LAPSED_IDS = f"""
    SELECT l.id FROM {_TABLE} l
    WHERE l.claim_expires_at IS NOT NULL AND l.claim_expires_at <= %(now)s
          AND l.id <> ALL(%(skip)s::uuid[]) {{only}}
    ORDER BY l.claim_expires_at
    LIMIT {LAPSED_PER_CLAIM}"""
LAPSED_LEASES = f"""
UPDATE {_TABLE} t
SET claim_expires_at = NULL, updated_at = %(now)s, due_at = %(now)s
WHERE t.id IN ({_LAPSED_IDS}
    FOR UPDATE SKIP LOCKED)
"""


def lapsed_leases_query(
    now: datetime, skip: Collection[uuid.UUID] = (), only: uuid.UUID | None = None, *, ids: bool = False
) -> tuple[str, dict[str, Any]]:
    """The give-back of lapsed leases (:data:`LAPSED_LEASES`) and its parameters: none of ``skip`` (rows
    set aside as poison: a row the give-back cannot write must not fail every claim), only ``only`` if
    given (a give-back row by row, ``claim._Claim.isolate``). ``ids``: the SELECT of the rows' ids instead,
    unlocked."""
    only_row = "AND l.id = %(only)s" if only is not None else ""
    sql = (_LAPSED_IDS if ids else LAPSED_LEASES).format(only=only_row)
    return sql, {"now": now, "skip": [str(i) for i in skip], "only": only}


__all__ = ["LAPSED_LEASES", "LAPSED_PER_CLAIM", "lapsed_leases_query"]
