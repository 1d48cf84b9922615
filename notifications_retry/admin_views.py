"""The queue health dashboard (an admin page) and its server-rendered SVG backlog chart."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.db.models import Count, Min
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from notifications_retry.observability import health

from .clock import default_clock
from .conf import get_settings
from .models import BacklogSample, ChannelConfig, NotificationEntity, WorkerHeartbeat

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

CHART_SERIES = (
    ("due_backlog", "due backlog", "nr-series-due"),
    ("failed_backlog", "failed (retrying)", "nr-series-failed"),
    ("dead_letters_unresolved", "dead letters unresolved", "nr-series-dead"),
)


def format_age(seconds: float) -> str:
    """A short human duration: 42s, 5m, 3h 10m, 2d 4h."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if hours else f"{days}d"


@dataclasses.dataclass
class Chart:
    """Everything the template needs to draw the chart: no arithmetic in the template."""

    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    series: list[dict[str, Any]]
    y_ticks: list[dict[str, Any]]
    x_ticks: list[dict[str, Any]]
    samples: int
    peak: int


def backlog_chart(
    samples: Sequence[BacklogSample],
    start: datetime,
    end: datetime,
    *,
    width: int = 760,
    height: int = 240,
    max_points: int = 288,
) -> Chart:
    """Scale samples into SVG coordinates; more than ``max_points`` are bucketed (peak kept)."""
    left, right, top, bottom = 48, 12, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    span = max((end - start).total_seconds(), 1.0)
    points: list[BacklogSample] = list(samples)
    if len(points) > max_points:
        size = -(-len(points) // max_points)
        buckets = [points[i : i + size] for i in range(0, len(points), size)]
        points = [
            max(b, key=lambda s: s.due_backlog + s.failed_backlog + s.dead_letters_unresolved)
            for b in buckets
        ]
    peak = max((getattr(s, name) for s in points for name, _, _ in CHART_SERIES), default=0)
    scale_max = _nice_ceiling(peak)

    def x(when: datetime) -> float:
        return round(left + plot_w * min(max((when - start).total_seconds() / span, 0.0), 1.0), 1)

    def y(value: float) -> float:
        return round(top + plot_h * (1 - value / scale_max), 1)

    series = []
    for name, label, css in CHART_SERIES:
        coords = " ".join(f"{x(s.taken_at)},{y(getattr(s, name))}" for s in points)
        latest = getattr(points[-1], name) if points else 0
        series.append({"name": name, "label": label, "css": css, "points": coords, "latest": latest})
    intervals = 4 if scale_max == 4 else 5  # 10, 20, 50, 100… split into round steps
    y_ticks = [
        {"y": y(scale_max * i / intervals), "label": f"{scale_max * i / intervals:g}"}
        for i in range(intervals + 1)
    ]
    x_ticks = []
    for hours_back in range(24, -1, -6):
        when = end - timedelta(hours=hours_back)
        x_ticks.append({"x": x(when), "label": "now" if hours_back == 0 else f"-{hours_back}h"})
    return Chart(width, height, left, top, plot_w, plot_h, series, y_ticks, x_ticks, len(samples), peak)


def _nice_ceiling(value: float) -> float:
    """A round axis maximum at or above ``value`` (1, 2 or 5 times a power of ten), at least 4."""
    if value <= 4:
        return 4
    magnitude = 1
    while magnitude * 10 <= value:
        magnitude *= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return float(step * magnitude)
    return float(10 * magnitude)


def _changelist(**params: Any) -> str:
    base = reverse("admin:notifications_retry_notificationentity_changelist")
    return f"{base}?{urlencode(params)}" if params else base


def dashboard_context(now: datetime) -> dict[str, Any]:
    """The dashboard's figures at ``now`` (separate from the view so tests can call it)."""
    conf = get_settings()
    channel_ids = dict(ChannelConfig.objects.values_list("key", "pk"))
    breakdown = health.status_breakdown(now)
    statuses = [s.value for s in NotificationEntity.Status]
    status_totals = {s: {"count": 0, "oldest": 0.0} for s in statuses}
    rows = []
    for row in breakdown:
        total = status_totals.setdefault(row.status, {"count": 0, "oldest": 0.0})
        total["count"] += row.count
        total["oldest"] = max(total["oldest"], row.oldest_age_seconds)
        rows.append(
            {
                "status": row.status,
                "channel": row.channel,
                "count": row.count,
                "oldest": format_age(row.oldest_age_seconds),
                "url": _changelist(
                    status__exact=row.status, channel__id__exact=channel_ids.get(row.channel, "")
                ),
            }
        )
    totals = [
        {
            "status": s,
            "count": t["count"],
            "oldest": format_age(t["oldest"]) if t["count"] else "—",
            "url": _changelist(status__exact=s),
        }
        for s, t in status_totals.items()
    ]
    backlog = health.backlog(now)
    since = now - timedelta(hours=24)
    terminal: list[dict[str, Any]] = [
        dict(row)
        for row in NotificationEntity.objects.filter(dead_lettered_at__gte=since)
        .values("error_kind")
        .annotate(count=Count("pk"), first=Min("dead_lettered_at"))
        .order_by("-count", "error_kind")
    ]
    since_param = since.replace(microsecond=0).isoformat()
    for item in terminal:
        item["label"] = item["error_kind"] or "(none)"
        item["url"] = _changelist(
            dead_letter="yes", error_kind=item["error_kind"], dead_lettered_at__from=since_param
        )
    samples = list(BacklogSample.objects.filter(taken_at__gte=since, taken_at__lte=now).order_by("taken_at"))
    heartbeats = []
    for beat in WorkerHeartbeat.objects.order_by("lane"):
        last = beat.last_tick_completed_at or beat.last_tick_started_at
        age = (now - last).total_seconds() if last else None
        heartbeats.append(
            {
                "lane": beat.lane,
                "host": beat.hostname,
                "pid": beat.pid,
                "age": format_age(age) if age is not None else "never",
                "stale": age is None or age > conf.HEARTBEAT_MAX_AGE_SECONDS,
                "stats": beat.last_tick_stats,
            }
        )
    channels = []
    for channel in ChannelConfig.objects.order_by("key"):
        channels.append(
            {
                "key": channel.key,
                "enabled": channel.is_enabled,
                "provider": channel.provider_key,
                "problems": channel.configuration_problems(),
                "url": reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk]),
                "list_url": _changelist(channel__id__exact=channel.pk),
            }
        )
    return {
        "now": now,
        "totals": totals,
        "breakdown": rows,
        "backlog": backlog,
        "oldest_due": format_age(backlog.oldest_due_age_seconds) if backlog.due else "—",
        "links": {
            "due": _changelist(queue="due"),
            "failed": _changelist(status__exact="failed", dead_letter="no"),
            "dead_unresolved": _changelist(dead_letter="unresolved"),
            "terminal_24h": _changelist(dead_letter="yes", dead_lettered_at__from=since_param),
            "all": _changelist(),
        },
        "terminal": terminal,
        "terminal_total": sum(item["count"] for item in terminal),
        "chart": backlog_chart(samples, since, now),
        "heartbeats": heartbeats,
        "channels": channels,
        "backlog_alert": backlog.failed_backlog > 1000,
    }


def dashboard_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> TemplateResponse:
    """The queue health page; the caller has checked the view permission."""
    now = default_clock(get_settings().CLOCK).now()
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Queue health",
        "opts": model_admin.opts,
        **dashboard_context(now),
    }
    return TemplateResponse(request, "notifications_retry/admin/dashboard.html", context)
