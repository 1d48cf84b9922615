"""What a waiting worker asks the database: LISTEN for wake-ups, and when its next row falls due.

Both run on one direct psycopg connection (the advisory lock's, see :mod:`notifications_retry.locks`):
a pooled session cannot LISTEN, and writers notify from their own transactions through any pooler
(``db_rules.wakeup_triggers``). The due time is read from the partial index on ``(channel, due_at,
priority)``, however large the backlog of rows scheduled later: per channel, its first row not leased,
and the ends of the leases of the rows before it in that index.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import psycopg

from notifications_retry.db_rules import WAKEUP_CHANNEL
from notifications_retry.models import ChannelConfig, NotificationEntity

#: Entries of a channel's due index read at most for the leases before its first row not leased.
LEASES_READ = 128

# A leased row keeps its due_at (db_rules.DUE_AT_RULE) and may be claimed again at its lease's end: a
# row is due at db_rules.effective_due. Per channel, ``d`` is the first row not leased, by the index
# (the leased rows before it, the calls in flight, are read and skipped); ``l`` the earliest lease's
# end among the first LEASES_READ rows up to it, which are the leased ones unless ``after`` left out
# due rows the last tick could not take. A lease past that read wakes no one by itself: the next
# wake-up or tick claims its row once the lease ran out. Leases are read at any priority (a lane
# woken by another's lease finds nothing and waits again), so that the planner's estimate of the read
# stays that of a short range (a selective filter made it large enough for JIT compilation, which
# cost more than the statement).
_EARLIEST_DUE = f"""
SELECT min(LEAST(d.due_at, l.expires))
FROM {ChannelConfig._meta.db_table} c
LEFT JOIN LATERAL (
    SELECT t.due_at FROM {NotificationEntity._meta.db_table} t
    WHERE t.channel_id = c.id AND t.due_at IS NOT NULL AND t.claim_token IS NULL {{rows}} {{priorities}}
    ORDER BY t.due_at
    LIMIT 1
) d ON true
LEFT JOIN LATERAL (
    SELECT min(e.claim_expires_at) AS expires FROM (
        SELECT t.claim_token, t.claim_expires_at FROM {NotificationEntity._meta.db_table} t
        WHERE t.channel_id = c.id AND t.due_at IS NOT NULL AND t.due_at <= COALESCE(d.due_at, 'infinity')
        ORDER BY t.due_at
        LIMIT {LEASES_READ}
    ) e
    WHERE e.claim_token IS NOT NULL {{leases}}
) l ON true
WHERE c.is_enabled {{channels}}
"""


def listen(conn: psycopg.Connection[Any]) -> None:
    """Subscribe ``conn`` (autocommit) to the wake-up notifications."""
    conn.execute(f"LISTEN {WAKEUP_CHANNEL}")


def earliest_due(
    conn: psycopg.Connection[Any],
    *,
    after: datetime | None,
    channels: Collection[str] | None,
    priorities: Sequence[int] | None,
) -> datetime | None:
    """When the earliest row (due later than ``after``, if given) of an enabled channel among
    ``channels`` (None: all), at one of ``priorities`` (None: any), may be claimed: its ``due_at``, or
    its lease's end while it is leased; None when no such row is due at all."""
    # Conditions only when given: each variant keeps its own plan, an index range where it can.
    sql = _EARLIEST_DUE.format(
        rows="AND t.due_at > %(after)s" if after is not None else "",
        leases="AND e.claim_expires_at > %(after)s" if after is not None else "",
        priorities="AND t.priority = ANY(%(priorities)s)" if priorities else "",
        channels="AND c.key = ANY(%(keys)s)" if channels is not None else "",
    )
    params = {"after": after, "priorities": list(priorities or []), "keys": sorted(channels or [])}
    row = conn.execute(sql, params).fetchone()
    return row[0] if row is not None else None


def notified(conn: psycopg.Connection[Any], seconds: float) -> bool:
    """Wait up to ``seconds`` for a wake-up; True when one came (every one waiting is consumed)."""
    got = False
    for _ in conn.notifies(timeout=max(0.0, seconds), stop_after=1):
        got = True
    if got:  # a burst arrives together: take the rest without waiting
        for _ in conn.notifies(timeout=0):
            pass
    return got


__all__ = ["earliest_due", "listen", "notified"]
