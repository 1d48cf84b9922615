"""Channel limits split among the lanes sending at the same time.

A channel's ``rate_limit_per_second`` and ``max_concurrency`` are the provider's limits, not a lane's:
two lanes whose owners both send on one channel (an "urgent" lane of high-priority rows and the default
lane, say) must not each use all of them, or the provider sees twice its limit and throttles both,
urgent traffic included. Every owner announces itself on a board, its lane's ``WorkerHeartbeat`` row
(``active_until`` on the database's clock, so the owners' clocks never have to agree, ``idle``,
``share_token``, ``settled_seen``), and gives each channel an even part of its limits among the active
lanes that can serve it.

Joining is acknowledged, not timed: an owner that joins while others are sending holds back its shared
channels until each of those lanes is idle between ticks (it reads the board before it sends again) or
has *settled* with it: its last read of the board saw the joiner's token, and its calls in flight fit
the parts it took then (``settled_seen`` lists the tokens of that read, and is emptied by a read after
which they do not fit). A token, not a time: a read's snapshot may miss an announcement made while it
ran, whatever clock either side takes. Owners read the board every ``REFRESH_SECONDS`` during a tick.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from django.db import Error, connection, transaction

from notifications_retry.models import NotificationEntity, WorkerHeartbeat

DEFAULT_LANE = "default"
#: How often a ticking owner reads the board and extends its announcement.
REFRESH_SECONDS = 1.0
#: How often a joining owner reads the board while it waits for the others to settle.
JOIN_POLL_SECONDS = 0.2
#: How long an announcement outlives its last refresh: a stalled owner stays counted this long.
ACTIVE_GRACE_SECONDS = 10.0


class SharedChannel(Protocol):
    """What the board needs of a channel's runtime state in the worker."""

    inflight: int
    held: bool

    @property
    def key(self) -> str: ...

    @property
    def max_concurrency(self) -> int: ...

    @property
    def rate_limit(self) -> float | None: ...

    @property
    def limits_shared(self) -> bool: ...

    @property
    def over_limit(self) -> bool: ...

    def set_share(self, share: int) -> bool: ...


def lane_channels(lanes: Mapping[str, Mapping[str, Any]], lane: str) -> frozenset[str] | None:
    """The channel keys ``lane`` can send on; ``None`` for every channel (the default lane, a lane
    selected by priorities only, or a lane these settings do not know, counted on the safe side)."""
    if lane == DEFAULT_LANE or lane not in lanes:
        return None
    channels = lanes[lane].get("channels")
    return frozenset(channels) if channels else None


def covers(lanes: Mapping[str, Mapping[str, Any]], lane: str, channel_key: str) -> bool:
    """Whether ``lane`` can send on ``channel_key``."""
    keys = lane_channels(lanes, lane)
    return keys is None or channel_key in keys


def sharers(lanes: Mapping[str, Mapping[str, Any]], active: Collection[str], channel_key: str) -> int:
    """How many of the ``active`` lanes can send on ``channel_key`` (at least one: the caller's own)."""
    return max(1, sum(1 for lane in active if covers(lanes, lane, channel_key)))


@dataclasses.dataclass(frozen=True)
class Announcement:
    """An active lane on the board."""

    lane: str
    idle: bool
    seen: frozenset[str]  # tokens its last settled read saw; empty when not settled


def _table() -> str:
    return connection.ops.quote_name(WorkerHeartbeat._meta.db_table)


def announce(
    lane: str, token: str, hold_seconds: float, *, idle: bool = False, seen: Collection[str] | None = None
) -> bool:
    """Mark ``lane`` active for ``hold_seconds`` of database time; ``seen``, when given, replaces the
    tokens of its last settled read. Returns whether the lane was not active under ``token`` before
    (it is joining: new, back after a lapse, or another instance taking over)."""
    table = _table()
    joined = None if seen is None else ",".join(sorted(seen))
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH previous AS (
                SELECT active_until > clock_timestamp() AND share_token = %s AS was
                FROM {table} WHERE lane = %s
            )
            INSERT INTO {table} AS hb
                (lane, hostname, pid, last_tick_stats, active_until, share_token, idle, settled_seen)
            VALUES (%s, '', 0, '{{}}', clock_timestamp() + make_interval(secs => %s), %s, %s,
                    COALESCE(%s, ''))
            ON CONFLICT (lane) DO UPDATE SET active_until = EXCLUDED.active_until,
                share_token = EXCLUDED.share_token, idle = EXCLUDED.idle,
                settled_seen = COALESCE(%s, hb.settled_seen)
            RETURNING (SELECT was FROM previous)
            """,
            [token, lane, lane, hold_seconds, token, idle, joined, joined],
        )
        (was,) = cursor.fetchone()
    return not was


def leave(lane: str, token: str) -> None:
    """Take ``lane`` off the board, unless another process announced it since."""
    WorkerHeartbeat.objects.filter(lane=lane, share_token=token).update(active_until=None, settled_seen="")


def read_board() -> tuple[list[Announcement], set[str]]:
    """The active lanes, and the tokens they were announced with."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT lane, idle, settled_seen, share_token FROM {_table()} "
            "WHERE active_until > clock_timestamp()"
        )
        rows = cursor.fetchall()
    board = [
        Announcement(lane, idle, frozenset(filter(None, seen.split(",")))) for lane, idle, seen, _ in rows
    ]
    return board, {token for *_, token in rows}


class LaneBoard:
    """One owner's side of the board: its announcements and the parts of the limits it takes."""

    def __init__(self, lane: str, lanes: Mapping[str, Mapping[str, Any]]) -> None:
        self.lane = lane
        self.lanes = lanes
        # Not the pid: another instance of the lane (pid 1 in its own container) must never be
        # mistaken for this one. A fresh one at every join: no acknowledgement of an earlier join,
        # still on another owner's row, can count for this one.
        self.token = uuid.uuid4().hex
        self.announced = False
        self.owner = True  # False once the lane's lock is lost: the board is the new owner's
        self.joining = False  # until every lane sharing a channel with this one has settled with it
        self.next_read = 0.0
        # Monotonic time until which the last announcement surely holds; past it, this owner may
        # have dropped off the board and others may have taken its part.
        self.valid_until = 0.0

    def _announce(self, hold: float, *, idle: bool = False, seen: Collection[str] | None = None) -> None:
        started = time.monotonic()
        if announce(self.lane, self.token, hold, idle=idle, seen=seen):
            self.token = uuid.uuid4().hex
            announce(self.lane, self.token, hold, idle=idle, seen=())
            self.joining = True
        self.announced = True
        # Margin for the statement's own time and the clocks' rates.
        self.valid_until = started + hold - 1.0

    def begin_tick(self, channels: Iterable[SharedChannel], now_mono: float, bound: Any) -> None:
        """Announce the lane as sending, then take this tick's parts (holding back when joining)."""
        self.owner = True
        self._read(channels, now_mono, bound)

    def refresh(self, channels: Iterable[SharedChannel], now_mono: float, bound: Any) -> None:
        """Read the board again if it is time; a database error keeps the parts in force."""
        if now_mono >= self.valid_until and self.owner:
            # Possibly off the board: start nothing more on shared channels until back and acknowledged.
            for channel in channels:
                channel.held = channel.held or channel.limits_shared
        if now_mono < self.next_read:
            return
        try:
            # A savepoint when the caller is inside a transaction: a failed statement must not
            # leave it aborted for the claims and finalizes after it.
            with transaction.atomic():
                self._read(channels, now_mono, bound)
        except Error as exc:  # InterfaceError too: a closed connection
            self.next_read = now_mono + REFRESH_SECONDS
            bound.warning("lane-shares-refresh-failed", error=repr(exc))

    def _read(self, channels: Iterable[SharedChannel], now_mono: float, bound: Any) -> None:
        channels = list(channels)
        if self.owner:
            self._announce(ACTIVE_GRACE_SECONDS)
        board, tokens = read_board()
        active = {a.lane for a in board} | {self.lane}
        unsettled = [
            a.lane
            for a in board
            if self.joining and a.lane != self.lane and not a.idle and self.token not in a.seen
        ]
        settled = True
        for channel in channels:
            lanes = sharers(self.lanes, active, channel.key)
            was_held = channel.held
            channel.held = channel.limits_shared and any(
                covers(self.lanes, u, channel.key) for u in unsettled
            )
            if channel.set_share(lanes) or channel.held != was_held:
                # More lanes than calls allowed: each keeps one, so together they go over.
                (bound.warning if channel.over_limit else bound.info)(
                    "channel-limits-shared",
                    channel=channel.key,
                    lanes=lanes,
                    max_concurrency=channel.max_concurrency,
                    rate_limit_per_second=channel.rate_limit,
                    held=channel.held,
                    over_limit=channel.over_limit,
                )
            settled = settled and channel.inflight <= channel.max_concurrency
        if not any(channel.held for channel in channels):
            self.joining = False
        if self.owner:
            self._announce(ACTIVE_GRACE_SECONDS, seen=tokens if settled else ())
        self.next_read = now_mono + (JOIN_POLL_SECONDS if self.joining else REFRESH_SECONDS)

    def lock_lost(self) -> None:
        """Another instance may own the lane now: its place on the board is no longer this one's."""
        self.owner = False

    def end_tick(self, looping: bool, interval: float, calls_running: bool, bound: Any) -> None:
        """Looping: stay on the board, idle, until the next tick; otherwise leave it."""
        if not self.owner:
            return
        try:
            if looping:
                # Idle means "reads the board before sending again": not while calls still run.
                self._announce(interval + ACTIVE_GRACE_SECONDS, idle=not calls_running)
            else:
                self.leave()
        except Error as exc:  # InterfaceError too: a closed connection
            bound.warning("lane-shares-update-failed", error=repr(exc))

    def leave(self) -> None:
        """Give this lane's parts back; only an owner that announced it (a standby has nothing to give)."""
        if self.announced and self.owner:
            leave(self.lane, self.token)
        self.announced = False


def has_due_rows(channel_ids: Collection[int], now: datetime, priorities: Collection[int] | None) -> bool:
    """Whether any of these channels has a row due for a lane of these priorities (all: ``None``)."""
    rows = NotificationEntity.objects.due(now).filter(channel_id__in=list(channel_ids))
    if priorities:
        rows = rows.filter(priority__in=list(priorities))
    return rows.exists()
