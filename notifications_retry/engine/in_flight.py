"""A worker's own cap on calls in flight across all its channels (``WORKER_MAX_IN_FLIGHT``).

A channel's ``max_concurrency`` protects its provider and is a total over every worker; this cap
protects the worker's process (its sockets, memory and event loop), whatever the channels add up to.
Every channel runtime of a worker shares one :class:`InFlightCap`: a send starts only while the worker
has a free slot, and claims are sized so that the worker keeps about ``QUEUE_ROUNDS`` rounds queued
behind its calls, as a single channel does, never that much per channel.

A call keeps its slot after it ends, until its outcome is committed (or dropped): a worker killed
at any moment has sent again, after its leases run out, no more than its cap of calls. The completer
commits at once whenever a send waits for a slot that an uncommitted outcome holds
(engine.completer), so the slot is back after one commit's round trip, not after the batch delay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from notifications_retry.delivery.channel_rules import QUEUE_ROUNDS
from notifications_retry.rules.outcomes import Outcome


class InFlightCap:
    """Calls in flight now across a worker's channels, and the most allowed (None: no cap)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        #: Changed only through the channel runtimes' ``inflight`` (on the worker's thread).
        self.count = 0
        #: Records whose call ended and whose outcome is not committed yet: each still holds its slot.
        self.held: set[str] = set()

    @property
    def free(self) -> bool:
        """Whether one more call may start."""
        return self.limit is None or self.count + len(self.held) < self.limit

    def hold(self, record_id: str) -> None:
        """A call on this cap ended: its slot stays taken until its outcome leaves the completer."""
        if self.limit is not None:
            self.held.add(record_id)

    def release(self, outcomes: Iterable[Outcome]) -> None:
        """These outcomes were committed, refused or dropped: the slots they held are free."""
        if self.held:
            for outcome in outcomes:
                self.held.discard(outcome.record.id_text)

    def forget_held(self) -> None:
        """The tick's outcomes are all committed or given up: no slot waits for a commit any more."""
        self.held.clear()

    @property
    def waiting_for_commit(self) -> bool:
        """Whether a send waits for a slot that only a commit frees (then commit now, not in a batch)."""
        return bool(self.held) and not self.free

    def room(self, queued: int) -> int | None:
        """Records the worker may claim beside ``queued`` ones (None: no cap): its calls in flight and
        ``QUEUE_ROUNDS`` rounds queued behind them, like one channel's claim."""
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
