"""A worker's own cap on calls in flight across all its channels (``WORKER_MAX_IN_FLIGHT``).

A channel's ``max_concurrency`` protects its provider and is a total over every worker; this cap
protects the worker's process (its sockets, memory and event loop), whatever the channels add up to.
Every channel runtime of a worker shares one :class:`InFlightCap`: a send starts only while the worker
has a free slot, and claims are sized so that the worker keeps about one round queued behind its
calls, as a single channel does, never one round per channel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from notifications_retry.delivery.channel_rules import QUEUE_ROUNDS


class InFlightCap:
    """Calls in flight now across a worker's channels, and the most allowed (None: no cap)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: Changed only through the channel runtimes' ``inflight`` (on the worker's thread).
        self.count = 0

    @property
    def free(self) -> bool:
        """Whether one more call may start."""
        return self.limit is None or self.count < self.limit

    def room(self, queued: int) -> int | None:
        """Records the worker may claim beside ``queued`` ones (None: no cap): its calls in flight and
        one round queued behind them, like one channel's claim."""
        if self.limit is None:
            return None
        return max(0, (QUEUE_ROUNDS + 1) * self.limit - self.count - queued)


class _Sender(Protocol):
    """What :func:`fit_to_room` reads of a channel runtime."""

    cap: InFlightCap

    @property
    def inline(self) -> bool: ...

    @property
    def queued(self) -> int: ...


def fit_to_room(runtimes: Mapping[int, _Sender], wanted: Mapping[int, int]) -> dict[int, int]:
    """``wanted`` (records per channel id) trimmed so that the worker's channels together claim no more
    than their cap's room; each channel gets an even part, and what one does not need goes to the others.

    Inline channels (no call in flight: they are sent on the worker's thread) are never trimmed.
    """
    fitted = dict(wanted)
    by_cap: dict[int, list[int]] = {}
    caps: dict[int, InFlightCap] = {}
    for cid, count in wanted.items():
        rt = runtimes[cid]
        if rt.inline or count <= 0 or rt.cap.limit is None:
            continue
        by_cap.setdefault(id(rt.cap), []).append(cid)
        caps[id(rt.cap)] = rt.cap
    for key, cids in by_cap.items():
        queued = sum(runtimes[cid].queued for cid in runtimes if runtimes[cid].cap is caps[key])
        room = caps[key].room(queued) or 0
        # Water-filling: the smallest wants are met whole, the rest share what is left evenly.
        pending = sorted(cids, key=lambda cid: wanted[cid])
        while pending:
            part = room // len(pending)
            cid = pending.pop(0)
            give = min(wanted[cid], part if pending else room)
            fitted[cid] = give
            room -= give
    return fitted
