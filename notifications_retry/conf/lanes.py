"""Lanes: which channels and priorities a worker serves, and its share of each channel's limits.

A lane's share of a channel's ``rate_limit_per_second`` and ``max_concurrency`` is static: set in
``LANES[name]["shares"][channel_key]`` (a fraction in (0, 1]), else an even split among the configured
lanes that can send on the channel. Nothing is negotiated at run time, so an idle lane's part is
not lent to the others: the split is the configuration's promise, easy to read and to check.

The default lane (a worker started without ``--lane``) serves every channel at its whole limit,
unless ``LANES`` names ``"default"`` too, in which case it takes its part like any other lane.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DEFAULT_LANE = "default"

LaneSettings = Mapping[str, Mapping[str, Any]]


def lane_channels(lanes: LaneSettings, lane: str) -> frozenset[str] | None:
    """The channel keys ``lane`` can send on; ``None`` for every channel."""
    if lane not in lanes:
        return None
    channels = lanes[lane].get("channels")
    return frozenset(channels) if channels else None


def covers(lanes: LaneSettings, lane: str, channel_key: str) -> bool:
    """Whether ``lane`` can send on ``channel_key``."""
    keys = lane_channels(lanes, lane)
    return keys is None or channel_key in keys


def share(lanes: LaneSettings, lane: str, channel_key: str) -> float:
    """The fraction of ``channel_key``'s limits that ``lane`` may use, in (0, 1]."""
    if lane not in lanes:
        return 1.0
    shares = lanes[lane].get("shares")
    explicit = shares.get(channel_key) if isinstance(shares, Mapping) else None
    if explicit is not None:
        return float(explicit)
    sharers = sum(1 for name in lanes if covers(lanes, name, channel_key))
    return 1.0 / max(1, sharers)


def shared_limits(
    lanes: LaneSettings, lane: str, channel_key: str, *, max_concurrency: int, rate_limit: float | None
) -> tuple[int, float | None]:
    """This lane's concurrency (at least one call) and rate limit (``None``: no limit) on a channel."""
    part = share(lanes, lane, channel_key)
    concurrency = max(1, int(max_concurrency * part))
    return concurrency, (float(rate_limit) * part if rate_limit else None)


def share_problems(lanes: LaneSettings) -> list[str]:
    """What is wrong with the lanes' ``shares`` (for the settings check)."""
    problems: list[str] = []
    totals: dict[str, float] = {}
    for name, lane in lanes.items():
        shares = lane.get("shares") or {}
        if not isinstance(shares, Mapping):
            problems.append(f"LANES[{name!r}]['shares'] must map channel keys to fractions in (0, 1]")
            continue
        for key, value in shares.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                problems.append(
                    f"LANES[{name!r}]['shares'][{key!r}] must be a fraction in (0, 1], got {value!r}"
                )
                continue
            if not covers(lanes, name, key):
                problems.append(
                    f"LANES[{name!r}]['shares'] names channel {key!r}, which the lane does not serve"
                )
    for name in lanes:
        for key in _channels_named(lanes):
            if covers(lanes, name, key):
                totals[key] = totals.get(key, 0.0) + share(lanes, name, key)
    for key, total in sorted(totals.items()):
        if total > 1.0 + 1e-9:
            problems.append(
                f"the lanes' shares of channel {key!r} add up to {total:g}, more than its whole limit"
            )
    return problems


def _channels_named(lanes: LaneSettings) -> set[str]:
    named: set[str] = set()
    for lane in lanes.values():
        named.update(lane.get("channels") or ())
        shares = lane.get("shares")
        if isinstance(shares, Mapping):
            named.update(shares)
    return named
