"""The queue health page: counts by status and channel, terminal failures, the backlog chart, workers."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.db.models import Count, Min
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from notifications_retry.conf import get_settings, heartbeat_max_age
from notifications_retry.models import BacklogSample, ChannelConfig, NotificationEntity, WorkerHeartbeat
from notifications_retry.runtime.clock import default_clock

from .chart import DEFAULT_RANGE, RANGES, axis_start, backlog_chart
from .display import format_age

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin


def _changelist(**params: Any) -> str:
    base = reverse("admin:notifications_retry_notificationentity_changelist")
    return f"{base}?{urlencode(params)}" if params else base


def dashboard_context(now: datetime, chart_range: str = DEFAULT_RANGE) -> dict[str, Any]:
    """The dashboard's figures at ``now``, the chart over ``chart_range`` (a key of ``RANGES``).

    Separate from the view so tests can call it.
    """
    conf = get_settings()
    channel_ids = dict(ChannelConfig.objects.values_list("key", "pk"))
    breakdown = NotificationEntity.objects.status_breakdown(now)
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
    backlog = NotificationEntity.objects.backlog(now)
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
    span, range_words = RANGES[chart_range]
    samples = list(
        BacklogSample.objects.filter(taken_at__gte=now - span, taken_at__lte=now).order_by("taken_at")
    )
    heartbeats = []
    max_age = heartbeat_max_age(conf)
    for beat in WorkerHeartbeat.objects.order_by("lane"):
        last = beat.last_tick_completed_at or beat.last_tick_started_at
        age = (now - last).total_seconds() if last else None
        heartbeats.append(
            {
                "lane": beat.lane,
                "host": beat.hostname,
                "pid": beat.pid,
                "age": format_age(age) if age is not None else "never",
                "stale": age is None or age > max_age,
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
    chart = backlog_chart(samples, axis_start(samples, now - span, now), now)
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
        "chart": chart,
        "chart_latest_age": format_age((now - chart.latest_at).total_seconds()) if chart.latest_at else "",
        "chart_range": chart_range,
        "chart_range_words": range_words,
        "chart_ranges": [{"key": key, "url": f"?{urlencode({'range': key})}"} for key in RANGES],
        "heartbeats": heartbeats,
        "channels": channels,
        "backlog_alert": backlog.failed_backlog > 1000,
    }


def dashboard_view(request: HttpRequest, model_admin: ModelAdmin[Any]) -> TemplateResponse:
    """The queue health page; the caller has checked the view permission.

    ``?range=`` picks the chart's range; an unknown value is named on the page, which shows the default.
    """
    now = default_clock(get_settings().CLOCK).now()
    asked = request.GET.get("range", DEFAULT_RANGE)
    chart_range = asked if asked in RANGES else DEFAULT_RANGE
    problem = "" if asked in RANGES else f"Unknown range {asked!r}: pick one of {', '.join(RANGES)}."
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Queue health",
        "opts": model_admin.opts,
        "range_error": problem,
        **dashboard_context(now, chart_range),
    }
    return TemplateResponse(request, "notifications_retry/admin/dashboard.html", context)
