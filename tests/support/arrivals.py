"""What a receiver's arrival times say about a rate limit."""

from __future__ import annotations

import bisect
from collections.abc import Iterable


def max_in_window(times: Iterable[float], window: float = 1.0) -> int:
    """The most of ``times`` within any ``window`` seconds (a window starting at each time)."""
    ordered = sorted(times)
    return max(bisect.bisect_left(ordered, t + window, lo=i) - i for i, t in enumerate(ordered))
