"""Channel limits split among the lanes sending at the same time.

A channel's ``rate_limit_per_second`` and ``max_concurrency`` are the provider's limits, not a lane's:
two lanes whose owners both send on one channel (an "urgent" lane of high-priority rows and the default
lane, say) must not each use all of them, or the provider sees twice its limit and throttles both,
urgent traffic included. Every owner announces itself in its lane's ``WorkerHeartbeat.active_until``
(database time, so the owners' clocks never have to agree) and splits each channel's limits evenly
among the active lanes that can serve that channel.

An owner that joins while others are active holds back its shared channels for ``JOIN_WAIT_SECONDS``:
the others re-read the board every ``REFRESH_SECONDS`` during a tick (and at every tick's start), so
by then they have scaled down and the sum never goes over the limit.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from django.db import connection

from .models import WorkerHeartbeat

DEFAULT_LANE = "default"
#: How often a ticking owner re-reads which lanes are active, and extends its own announcement.
REFRESH_SECONDS = 1.0
#: How long a joining owner waits before sending on a channel it shares: one refresh and a margin.
JOIN_WAIT_SECONDS = REFRESH_SECONDS + 0.5
#: How long an announcement outlives its last refresh: a stalled owner stays counted this long.
ACTIVE_GRACE_SECONDS = 10.0


def lane_channels(lanes: Mapping[str, Mapping[str, Any]], lane: str) -> frozenset[str] | None:
    """The channel keys ``lane`` can send on; ``None`` for every channel (the default lane, a lane
    selected by priorities only, or a lane these settings do not know, counted on the safe side)."""
    if lane == DEFAULT_LANE or lane not in lanes:
        return None
    channels = lanes[lane].get("channels")
    return frozenset(channels) if channels else None


def sharers(lanes: Mapping[str, Mapping[str, Any]], active: Collection[str], channel_key: str) -> int:
    """How many of the ``active`` lanes can send on ``channel_key`` (at least one: the caller's own)."""
    count = 0
    for lane in active:
        keys = lane_channels(lanes, lane)
        if keys is None or channel_key in keys:
            count += 1
    return max(1, count)


def _table() -> str:
    return connection.ops.quote_name(WorkerHeartbeat._meta.db_table)


def announce(lane: str, hold_seconds: float, hostname: str, pid: int) -> bool:
    """Mark ``lane`` active for ``hold_seconds`` of database time; True when it was not active before
    (it is joining, and the others may not know yet)."""
    table = _table()
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH previous AS (SELECT active_until > clock_timestamp() AS was FROM {table} WHERE lane = %s)
            INSERT INTO {table} AS hb (lane, hostname, pid, last_tick_stats, active_until)
            VALUES (%s, %s, %s, '{{}}', clock_timestamp() + make_interval(secs => %s))
            ON CONFLICT (lane) DO UPDATE SET active_until = EXCLUDED.active_until,
                hostname = EXCLUDED.hostname, pid = EXCLUDED.pid
            RETURNING (SELECT was FROM previous)
            """,
            [lane, lane, hostname, pid, hold_seconds],
        )
        row = cursor.fetchone()
    return not (row and row[0])


def leave(lane: str, hostname: str, pid: int) -> None:
    """Mark ``lane`` inactive now, unless another process announced it since: the others get its
    share back at their next refresh."""
    WorkerHeartbeat.objects.filter(lane=lane, hostname=hostname, pid=pid).update(active_until=None)


def active_lanes() -> set[str]:
    """Lanes whose owner announced itself active until later than now."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT lane FROM {_table()} WHERE active_until > clock_timestamp()")
        return {lane for (lane,) in cursor.fetchall()}
