"""Liveness of the retry worker: is a lane still completing ticks? (``retry_worker --check``.)

The worker writes ``WorkerHeartbeat.last_tick_completed_at`` at the end of every tick it owns, with the
same clock it uses for due decisions (the database's by default); this check reads it with that clock
too, so a skewed host clock cannot make a healthy worker look dead or the other way round.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime

from django.db import DatabaseError

from notifications_retry.conf import DEFAULT_LANE, get_settings, heartbeat_max_age
from notifications_retry.models import WorkerHeartbeat
from notifications_retry.observability.heartbeat_file import read_age
from notifications_retry.runtime.clock import Clock, default_clock

__all__ = ["Liveness", "check_liveness", "check_process_liveness"]


@dataclasses.dataclass(frozen=True)
class Liveness:
    """The verdict for one lane, with the figures behind it."""

    lane: str
    healthy: bool
    reason: str
    max_age_seconds: float
    last_completed_at: datetime | None = None
    age_seconds: float | None = None

    def describe(self) -> str:
        """One line for a probe's output."""
        state = "healthy" if self.healthy else "unhealthy"
        return f"{state}: lane {self.lane!r}: {self.reason}"


def check_liveness(
    lane: str | None = None, max_age: float | None = None, clock: Clock | None = None
) -> Liveness:
    """Unhealthy when the lane never completed a tick, or its last completed tick is older than
    ``max_age`` seconds (default :func:`~notifications_retry.conf.heartbeat_max_age`), or the database
    cannot be read."""
    conf = get_settings()
    lane = lane or DEFAULT_LANE
    limit = float(max_age if max_age is not None else heartbeat_max_age(conf))
    try:
        clock = clock or default_clock(conf.CLOCK)
        now = clock.now()
        beat = WorkerHeartbeat.objects.filter(lane=lane).first()
    except DatabaseError as exc:
        return Liveness(
            lane, False, f"cannot read the heartbeat: {exc.__class__.__name__}: {exc}".strip(), limit
        )
    if beat is None or beat.last_tick_completed_at is None:
        return Liveness(lane, False, "no tick has completed yet", limit)
    age = (now - beat.last_tick_completed_at).total_seconds()
    if age > limit:
        return Liveness(
            lane,
            False,
            f"last tick completed {age:.0f}s ago (max {limit:g}s, host "
            f"{beat.hostname or '?'} pid {beat.pid})",
            limit,
            beat.last_tick_completed_at,
            age,
        )
    return Liveness(
        lane,
        True,
        f"last tick completed {max(age, 0):.0f}s ago (max {limit:g}s)",
        limit,
        beat.last_tick_completed_at,
        age,
    )


def check_process_liveness(
    path: str, lane: str | None = None, max_age: float | None = None, now: float | None = None
) -> Liveness:
    """Unhealthy when the worker process writing ``path`` (``retry_worker --heartbeat-file``) has not
    written it for ``max_age`` seconds (default :func:`~notifications_retry.conf.heartbeat_max_age`), or
    never did. ``now``: wall time, the writer's own clock (the same host's)."""
    limit = float(max_age if max_age is not None else heartbeat_max_age(get_settings()))
    lane = lane or DEFAULT_LANE
    try:
        age, body = read_age(path, time.time() if now is None else now)
    except FileNotFoundError:
        return Liveness(lane, False, f"no heartbeat written to {path} yet", limit)
    except (OSError, ValueError) as exc:
        return Liveness(lane, False, f"cannot read the heartbeat file {path}: {exc}", limit)
    who = f"pid {body.get('pid')}, partitions {body.get('partitions') or 'none'}"
    if body.get("lane") != lane:
        return Liveness(lane, False, f"{path} is lane {body.get('lane')!r}'s heartbeat ({who})", limit)
    if age > limit:
        return Liveness(
            lane, False, f"process last beat {age:.0f}s ago (max {limit:g}s; {who})", limit, None, age
        )
    return Liveness(
        lane, True, f"process last beat {max(age, 0):.0f}s ago (max {limit:g}s; {who})", limit, None, age
    )
