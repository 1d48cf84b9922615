"""The queue health page's backlog chart: its time axis fits the data it has, its range is selectable."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.admin.chart import ago_label, axis_start, backlog_chart, time_ticks
from notifications_retry.admin.dashboard import dashboard_context
from notifications_retry.models import BacklogSample
from tests.support.admin_pages import DASHBOARD

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.get_fixed_timezone(0))


def sample(minutes_ago: float, due: int = 1) -> BacklogSample:
    return BacklogSample(
        taken_at=NOW - timedelta(minutes=minutes_ago),
        due_backlog=due,
        failed_backlog=0,
        dead_letters_unresolved=0,
    )


def test_two_minutes_of_data_fill_the_axis_instead_of_a_line_at_now() -> None:
    samples = [sample(2, due=3), sample(1, due=5), sample(0, due=4)]
    start = axis_start(samples, NOW - timedelta(hours=24), NOW)
    assert start == NOW - timedelta(minutes=5)  # the shortest axis, not 24 h
    chart = backlog_chart(samples, start, NOW)
    xs = [float(p.split(",")[0]) for p in chart.series[0]["points"].split()]
    # the three points spread over the right 40 % of the plot, not within a pixel of "now"
    assert xs[-1] - xs[0] >= 0.39 * chart.plot_width
    assert [t["label"] for t in chart.x_ticks] == ["-5m", "-4m", "-3m", "-2m", "-1m", "now"]


def test_the_axis_starts_at_the_first_sample_inside_the_range() -> None:
    samples = [sample(m) for m in (300, 90, 45, 0)]
    assert axis_start(samples, NOW - timedelta(hours=24), NOW) == NOW - timedelta(minutes=300)
    assert axis_start(samples, NOW - timedelta(hours=1), NOW) == NOW - timedelta(minutes=45)
    assert axis_start([], NOW - timedelta(hours=6), NOW) == NOW - timedelta(hours=6)
    chart = backlog_chart(samples, NOW - timedelta(minutes=45), NOW)
    assert chart.samples == 2  # only what lies on the axis is drawn and counted


@pytest.mark.parametrize(
    ("span", "labels"),
    [
        (timedelta(minutes=45), ["-40m", "-30m", "-20m", "-10m", "now"]),
        (timedelta(hours=6), ["-6h", "-5h", "-4h", "-3h", "-2h", "-1h", "now"]),
        (timedelta(days=7), ["-6d", "-4d", "-2d", "now"]),
    ],
)
def test_ticks_are_round_steps_back_from_now(span: timedelta, labels: list[str]) -> None:
    assert [ago_label(b.total_seconds()) for b in time_ticks(NOW - span, NOW)] == labels


@pytest.mark.django_db
def test_range_selector_limits_the_samples_and_is_on_the_page(admin_client: Client) -> None:
    now = timezone.now()
    for minutes in (600, 300, 50, 10):
        row = sample(0)
        row.taken_at = now - timedelta(minutes=minutes)
        row.save()
    assert dashboard_context(now, "24h")["chart"].samples == 4
    one_hour = dashboard_context(now, "1h")
    assert one_hour["chart"].samples == 2 and one_hour["chart"].start == now - timedelta(minutes=50)

    response = admin_client.get(reverse(DASHBOARD), {"range": "6h"})
    assert response.status_code == 200
    assert response.context["chart"].samples == 3
    html = response.content.decode()
    assert "Backlog over the last 6 hours" in html
    for key in ("1h", "6h", "24h", "7d"):
        assert f'href="?range={key}"' in html
    assert 'class="selected" aria-current="true">6h<' in html


@pytest.mark.django_db
def test_an_unknown_range_is_named_and_the_default_shown(admin_client: Client) -> None:
    response = admin_client.get(reverse(DASHBOARD), {"range": "<b>3y</b>"})
    assert response.status_code == 200
    assert response.context["chart_range"] == "24h"
    html = response.content.decode()
    assert "Unknown range &#x27;&lt;b&gt;3y&lt;/b&gt;&#x27;" in html
    assert "<b>3y</b>" not in html
