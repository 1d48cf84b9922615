"""What a waiting worker asks the database: LISTEN for wake-ups, and when its next row falls due.

Both run on one direct psycopg connection (the advisory lock's, see
:mod:`notifications_retry.database.locks`):
a pooled session cannot LISTEN, and writers notify from their own transactions through any pooler
(``triggers.wakeup_triggers``). The due time is read with one index probe per channel (the partial
index on ``(channel, due_at, priority)``), however large the backlog of rows scheduled later, and one
probe of the leases' expiries. A worker that relays asks in the same statement whether an outbox event
waits (one probe of the unpublished events' partial index): its relay then needs no look of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import psycopg

from notifications_retry.database.triggers import WAKEUP_CHANNEL
from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox

# A leased row has no due_at (triggers.DUE_AT_RULE): the earliest lease expiry counts too, whatever
# its channel (one probe of nr_lease_expiry_idx), so that a worker wakes when a dead worker's lease
# lapses and its channel's claim gives the row back (delivery.claim_statements).
#
# PostgreSQL stores times Python's datetime cannot hold ('infinity', year 12000 written by raw SQL), and
# psycopg refuses to read them ("timestamp too large"): the answer is clamped in SQL, as the claim
# clamps a deadline, so such a row reads as due at the end of year 9999 (far away) or, before year 1,
# as due now (a day's margin either side keeps any session time zone within datetime's range).
_EARLIEST_DUE = f"""
SELECT CASE WHEN e.due IS NOT NULL THEN LEAST(GREATEST(e.due,
    '0001-01-02 00:00+00'::timestamptz), '9999-12-30 00:00+00'::timestamptz) END{{outbox}}
FROM (SELECT LEAST((
    SELECT min(d.due_at)
    FROM {ChannelConfig._meta.db_table} c
    CROSS JOIN LATERAL (
        SELECT t.due_at FROM {NotificationEntity._meta.db_table} t
        WHERE t.channel_id = c.id AND t.due_at IS NOT NULL {{rows}}
        ORDER BY t.due_at
        LIMIT 1
    ) d
    WHERE c.is_enabled {{channels}}
), (
    SELECT min(l.claim_expires_at) FROM {NotificationEntity._meta.db_table} l
    WHERE l.claim_expires_at IS NOT NULL {{leases}}
)) AS due) e
"""

#: The unpublished events' partial index, probed for one row (as ``outbox.relay.Relay.waiting``).
_OUTBOX_WAITING = f", EXISTS (SELECT 1 FROM {Outbox._meta.db_table} o WHERE o.published_at IS NULL)"


def listen(conn: psycopg.Connection[Any]) -> None:
    """Subscribe ``conn`` (autocommit) to the wake-up notifications."""
    conn.execute(f"LISTEN {WAKEUP_CHANNEL}")


def next_due(
    conn: psycopg.Connection[Any],
    *,
    after: datetime | None,
    channels: Collection[str] | None,
    priorities: Sequence[int] | None,
    outbox: bool,
) -> tuple[datetime | None, bool]:
    """The earliest ``due_at`` (later than ``after``, if given) of an enabled channel among ``channels``
    (None: all), at one of ``priorities`` (None: any), or the earliest lease expiry if sooner; None
    when no such row is due at all. A time beyond what Python's datetime holds reads as 9999-12-30,
    one before it as 0001-01-02. Beside it, in the same statement, whether an outbox event waits to be
    published (``outbox``; False when not asked)."""
    # Conditions only when given: each variant keeps its own plan, an index range where it can.
    rows = ("AND t.due_at > %(after)s " if after is not None else "") + (
        "AND t.priority = ANY(%(priorities)s)" if priorities else ""
    )
    sql = _EARLIEST_DUE.format(
        rows=rows,
        channels="AND c.key = ANY(%(keys)s)" if channels is not None else "",
        leases="AND l.claim_expires_at > %(after)s" if after is not None else "",
        outbox=_OUTBOX_WAITING if outbox else "",
    )
    params = {"after": after, "priorities": list(priorities or []), "keys": sorted(channels or [])}
    row = conn.execute(sql, params).fetchone()
    if row is None:
        return None, False
    return row[0], bool(outbox and row[1])


def notified(conn: psycopg.Connection[Any], seconds: float) -> bool:
    """Wait up to ``seconds`` for a wake-up; True when one came (every one waiting is consumed)."""
    got = False
    for _ in conn.notifies(timeout=max(0.0, seconds), stop_after=1):
        got = True
    if got:  # a burst arrives together: take the rest without waiting
        for _ in conn.notifies(timeout=0):
            pass
    return got


__all__ = ["listen", "next_due", "notified"]
