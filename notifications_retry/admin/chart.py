"""The backlog chart: samples scaled into SVG coordinates, so the template does no arithmetic."""

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
