"""Queue health: counts and the oldest age by status, and the backlog figures."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.models import Count, DateTimeField, Min, Value
from django.db.models.functions import Greatest

from notifications_retry.models import NotificationEntity, Outbox

#: The earliest time read back: PostgreSQL stores times Python cannot hold (``-infinity``, a year before
#: 1, written by raw SQL), and reading one would fail every tick's statistics and so the heartbeat.
EARLIEST_READABLE = datetime(1, 1, 2, tzinfo=UTC)


def _oldest(field: str) -> Greatest:
    """``Min(field)``, read no earlier than :data:`EARLIEST_READABLE` (a bound, not NULL, over no rows:
    the callers look at the count first)."""
    return Greatest(Min(field), Value(EARLIEST_READABLE, output_field=DateTimeField()))


@dataclasses.dataclass(frozen=True)
class StatusRow:
    """One (status, channel) group: how many rows and how old the oldest is."""

    status: str
    channel: str
    count: int
    oldest_age_seconds: float


@dataclasses.dataclass(frozen=True)
class Backlog:
    """What is waiting for the worker now."""

    due: int
    failed_backlog: int
    dead_letters_unresolved: int
    oldest_due_age_seconds: float


def status_breakdown(now: datetime) -> list[StatusRow]:
    """Counts and oldest age by status and channel (a full scan: for dashboards, not for ticks)."""
    rows = (
        NotificationEntity.objects.values("status", "channel__key")
        .annotate(count=Count("pk"), oldest=_oldest("created_at"))
        .order_by("status", "channel__key")
    )
    return [
        StatusRow(
            status=r["status"],
            channel=r["channel__key"],
            count=r["count"],
            oldest_age_seconds=max(0.0, (now - r["oldest"]).total_seconds()) if r["oldest"] else 0.0,
        )
        for r in rows
    ]


def backlog(now: datetime) -> Backlog:
    """Due rows, retry backlog, unresolved dead letters and the age of the oldest due row. A lapsed
    lease no claim gave back yet (its worker died) counts as due since its expiry.

    One statement: each figure is its own aggregate over the model's query (each on its own index),
    joined as one row. A worker counts it with its heartbeat, idle or not, and four round trips were
    three statements more each time."""
    objects = NotificationEntity.objects
    parts = [
        (objects.due(now), "due_at"),
        (objects.lapsed(now), "claim_expires_at"),
        (objects.failed_backlog(), None),
        (objects.unresolved_dead_letters(), None),
    ]
    selects: list[str] = []
    params: list[Any] = []
    for number, (rows, oldest) in enumerate(parts):
        sql, sql_params = rows.order_by().values(oldest or "pk").query.sql_with_params()
        figures = "count(*)" if oldest is None else f"count(*), greatest(min({oldest}), %s)"
        selects.append(f"(SELECT {figures} FROM ({sql}) AS part) AS p{number}")
        params.extend(sql_params if oldest is None else [EARLIEST_READABLE, *sql_params])
    with connections[objects.db].cursor() as cursor:
        cursor.execute(f"SELECT * FROM {', '.join(selects)}", params)
        due, due_oldest, lapsed, lapsed_oldest, failed, dead_letters = cursor.fetchone()
    oldest = min((at for count, at in ((due, due_oldest), (lapsed, lapsed_oldest)) if count), default=None)
    return Backlog(
        due=due + lapsed,
        failed_backlog=failed,
        dead_letters_unresolved=dead_letters,
        oldest_due_age_seconds=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
    )


@dataclasses.dataclass(frozen=True)
class OutboxBacklog:
    """What waits for the relay."""

    unpublished: int
    oldest_unpublished_age_seconds: float


def outbox_backlog(now: datetime) -> OutboxBacklog:
    """Unpublished events and the age of the oldest (0 when none waits): one statement over the partial
    index on unpublished events."""
    waiting = Outbox.objects.filter(published_at__isnull=True).aggregate(
        count=Count("pk"), oldest=_oldest("created_at")
    )
    oldest = waiting["oldest"] if waiting["count"] else None
    return OutboxBacklog(
        unpublished=waiting["count"],
        oldest_unpublished_age_seconds=max(0.0, (now - oldest).total_seconds()) if oldest else 0.0,
    )
