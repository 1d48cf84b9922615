"""The backlog chart: samples scaled into SVG coordinates, so the template does no arithmetic.

The time axis spans the data there is inside the selected range (two minutes of samples fill the width, not
a sliver at the right of a 24 h axis), with ticks at round steps counted back from now.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from notifications_retry.models import BacklogSample

CHART_SERIES = (
    ("due_backlog", "due backlog", "nr-series-due"),
    ("failed_backlog", "failed (retrying)", "nr-series-failed"),
    ("dead_letters_unresolved", "dead letters unresolved", "nr-series-dead"),
)

#: The ranges the dashboard offers: query value -> (span, words for the heading).
RANGES: dict[str, tuple[timedelta, str]] = {
    "1h": (timedelta(hours=1), "hour"),
    "6h": (timedelta(hours=6), "6 hours"),
    "24h": (timedelta(hours=24), "24 hours"),
    "7d": (timedelta(days=7), "7 days"),
}
DEFAULT_RANGE = "24h"
#: The shortest axis: a single sample (or a few seconds of them) still gets a readable width.
MIN_SPAN = timedelta(minutes=5)
#: Tick steps, smallest first; the chart takes the first that needs at most ``MAX_TICK_INTERVALS``.
TICK_STEPS = tuple(
    timedelta(minutes=m) for m in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 7 * 1440)
)
MAX_TICK_INTERVALS = 6


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
    start: datetime
    end: datetime
    #: When the newest sample was taken: the legend's figures are that sample's, not the cards' "now".
    latest_at: datetime | None = None


def axis_start(samples: Sequence[BacklogSample], range_start: datetime, end: datetime) -> datetime:
    """Where the time axis begins: at the first sample inside the range, and at least ``MIN_SPAN`` back."""
    first = min((s.taken_at for s in samples if s.taken_at >= range_start), default=range_start)
    return min(max(first, range_start), end - MIN_SPAN)


def ago_label(seconds: float) -> str:
    """A tick's label, counted back from now: -30s, -5m, -1h 30m, -24h, -3d."""
    seconds = round(seconds)
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return f"-{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"-{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"-{hours}h {minutes}m" if minutes else f"-{hours}h"
    days, hours = divmod(hours, 24)
    return f"-{days}d {hours}h" if hours else f"-{days}d"


def time_ticks(start: datetime, end: datetime) -> list[timedelta]:
    """How far back from ``end`` each tick sits, oldest first, at a round step fitting the span."""
    span = end - start
    step = next((s for s in TICK_STEPS if span / s <= MAX_TICK_INTERVALS), TICK_STEPS[-1])
    backs = []
    back = timedelta(0)
    while back <= span:
        backs.append(back)
        back += step
    return backs[::-1]


def backlog_chart(
    samples: Sequence[BacklogSample],
    start: datetime,
    end: datetime,
    *,
    width: int = 760,
    height: int = 240,
    max_points: int = 288,
) -> Chart:
    """Scale samples into SVG coordinates between ``start`` and ``end``; more than ``max_points`` are
    bucketed (peak kept)."""
    left, right, top, bottom = 48, 16, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    span = max((end - start).total_seconds(), 1.0)
    points: list[BacklogSample] = [s for s in samples if start <= s.taken_at <= end]
    count = len(points)
    last = points[-1] if points else None  # before bucketing: a bucket keeps its peak, not its last
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
        latest = getattr(last, name) if last is not None else 0
        series.append({"name": name, "label": label, "css": css, "points": coords, "latest": latest})
    intervals = 4 if scale_max == 4 else 5  # 10, 20, 50, 100… split into round steps
    y_ticks = [
        {"y": y(scale_max * i / intervals), "label": f"{scale_max * i / intervals:g}"}
        for i in range(intervals + 1)
    ]
    x_ticks = [
        {"x": x(end - back), "label": ago_label(back.total_seconds())} for back in time_ticks(start, end)
    ]
    return Chart(
        width,
        height,
        left,
        top,
        plot_w,
        plot_h,
        series,
        y_ticks,
        x_ticks,
        count,
        peak,
        start,
        end,
        latest_at=last.taken_at if last is not None else None,
    )


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
