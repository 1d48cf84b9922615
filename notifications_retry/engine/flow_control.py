"""Flow control held by the worker: per channel, a sender-side rate limit, a circuit breaker and the
spacing of a channel's starts over its calls' duration, and what each outcome tells them
(:class:`FlowFeedback`: a throttle pauses the channel, failures may open its circuit, and the records it
can then no longer send are handed back, :class:`Returned`); across channels, the worker's own cap on
calls in flight (:class:`InFlightCap`, below).

All run on the worker's scheduling thread and use monotonic seconds, never the database clock: they
pace and pause real calls, not due times.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import structlog
from structlog.typing import FilteringBoundLogger

from notifications_retry.rules.backoff import QUEUE_ROUNDS
from notifications_retry.rules.outcomes import SENT, THROTTLED, ClaimedRecord, Outcome

if TYPE_CHECKING:
    # For annotations only: engine.channels builds its runtimes of this module's parts, so it imports
    # this module, never the other way round.
    from notifications_retry.engine.channels import ChannelRuntime

log = structlog.get_logger("notifications_retry.worker")


class RateLimiter:
    """A token bucket of one token refilled every ``1 / rate`` seconds: sends start evenly spaced.

    A bucket of one means no burst: a channel that was idle (or a worker loop that fell behind) never
    catches up by sending back to back, so no 1-second window holds more than ``ceil(rate)`` starts.
    """

    def __init__(self, rate_per_second: float | None) -> None:
        self.interval = 0.0
        self.next_at = 0.0
        self.set_rate(rate_per_second)

    def set_rate(self, rate_per_second: float | None) -> None:
        """Change the rate (``None``: no limit); a start already booked keeps its time."""
        self.interval = 1.0 / rate_per_second if rate_per_second else 0.0

    @property
    def limited(self) -> bool:
        """Whether the channel has a rate limit at all."""
        return self.interval > 0

    def available_within(self, now: float, horizon: float) -> int:
        """How many sends may start between ``now`` and ``now + horizon``."""
        if not self.limited:
            return 1 << 30
        start = max(self.next_at, now)
        if start > now + horizon:
            return 0
        return math.floor((now + horizon - start) / self.interval) + 1

    def ready(self, now: float) -> bool:
        """Whether a send may start at ``now``."""
        return not self.limited or now >= self.next_at

    def take(self, now: float) -> None:
        """Record a send starting at ``now`` (call only when :meth:`ready`)."""
        if self.limited:
            self.next_at = max(self.next_at, now) + self.interval

    def wait_time(self, now: float) -> float:
        """Seconds until the next send may start (0 when it may start now)."""
        return max(0.0, self.next_at - now) if self.limited else 0.0


#: How much faster than its calls' own pace a channel's starts may follow one another: a burst is
#: spread, and a channel whose calls get faster is never held back for long (the pace follows them).
PACE_MARGIN = 2.0
#: Starts spaced further apart than this are not spaced at all. A burst then takes the loop a small
#: part of one call's time (a few answers a millisecond), so its answers hardly wait for one another,
#: while spreading it would split the commits of its outcomes into many small ones.
MAX_PACE_SPACING = 0.001
#: The longest a start is put off to spread a burst.
MAX_PACE_DELAY = 0.02
#: The weight of the last call in the mean call time the pace follows.
PACE_WEIGHT = 0.05


class StartPacer:
    """Spreads a channel's starts over its calls' mean duration, so its answers arrive spread too.

    Calls started in one burst (a claim's rows, a refilled queue) answer in one burst, and every
    answer then waits on the loop while those before it are handled and the next calls started; the
    burst comes back the same way on every round. Starts at most ``PACE_MARGIN`` times as close as
    ``mean call time / concurrency`` break it up; once spread, the calls keep their spacing and the
    pace delays nothing. Time here is the send loop's own clock, the one its waits run on.
    """

    def __init__(self) -> None:
        #: Mean call duration (seconds; 0 until a call ended), weighted toward the latest calls.
        self.mean_call = 0.0
        #: The earliest time the next start may take.
        self.next_at = 0.0

    def observe(self, seconds: float) -> None:
        """A call took ``seconds``."""
        seconds, mean = max(0.0, seconds), self.mean_call
        self.mean_call = mean + PACE_WEIGHT * (seconds - mean) if mean else seconds

    def delay(self, now: float, concurrency: int) -> float:
        """Seconds to put off a start due at ``now`` (0.0: start now); books the start's place."""
        spacing = self.mean_call / max(1, concurrency) / PACE_MARGIN
        if spacing <= 0 or spacing > MAX_PACE_SPACING:
            return 0.0
        at = min(max(now, self.next_at), now + MAX_PACE_DELAY)
        self.next_at = at + spacing
        return at - now


#: Called with (old state, new state) whenever a breaker changes state.
StateListener = Callable[[str, str], None]


class CircuitBreaker:
    """Opens after ``threshold`` consecutive retriable failures; one probe after ``cooldown``.

    closed → open (threshold reached) → half open (cool-down over: one probe may be taken) →
    closed (the probe succeeded) or open again (it failed). ``on_change`` hears every transition,
    including the time-driven open → half open one, so a metric and a log event can follow it.
    """

    CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"

    def __init__(self, threshold: int, cooldown: float, *, on_change: StateListener | None = None) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self.failures = 0
        self.state = self.CLOSED
        self.opened_at = 0.0
        #: When the circuit opened from closed (monotonic; None while closed): failed probes keep it.
        self.open_since: float | None = None
        self.probe_in_flight = False
        self.on_change = on_change

    def _set(self, state: str) -> str | None:
        old, self.state = self.state, state
        if old == state:
            return None
        if self.on_change is not None:
            self.on_change(old, state)
        return state

    @property
    def is_open(self) -> bool:
        """True while the channel must not be called (cool-down running)."""
        return self.state == self.OPEN

    def capacity(self, now: float, wanted: int, queued: int = 0) -> int:
        """How many records may be taken now: all when closed, one probe when half open, none when open.

        ``queued`` counts records already taken but not started: a probe waiting in the queue is the probe.
        """
        if self.state == self.OPEN:
            if now - self.opened_at < self.cooldown:
                return 0
            self.probe_in_flight = False
            self._set(self.HALF_OPEN)
        if self.state == self.HALF_OPEN:
            return 0 if self.probe_in_flight or queued else min(1, wanted)
        return wanted

    def started(self) -> None:
        """A call starts (in half open state, this is the probe)."""
        if self.state == self.HALF_OPEN:
            self.probe_in_flight = True

    def success(self) -> str | None:
        """Record a success; returns the new state when it changed."""
        self.failures = 0
        self.probe_in_flight = False
        self.open_since = None
        return self._set(self.CLOSED)

    def failure(self, now: float) -> str | None:
        """Record a retriable failure; returns the new state when it changed."""
        self.failures += 1
        if self.state == self.HALF_OPEN or (self.state == self.CLOSED and self.failures >= self.threshold):
            if self.state == self.CLOSED:
                self.open_since = now
            self.opened_at, self.probe_in_flight = now, False
            return self._set(self.OPEN)
        return None

    def open_for(self, now: float) -> float:
        """Seconds since the circuit opened from closed, failed probes included (0.0 while closed)."""
        return 0.0 if self.open_since is None else max(0.0, now - self.open_since)

    def neutral(self) -> None:
        """An outcome that says nothing about the provider's health (a permanent error)."""
        if self.state == self.HALF_OPEN:
            self.probe_in_flight = False


# --------------------------------------------------------------------------------------------------
# What an outcome tells its channel's flow control: a throttle pauses the channel, failures may open its
# circuit; the channel's queued records it can then no longer send are handed back.
# --------------------------------------------------------------------------------------------------

#: How long a channel pauses after the provider throttles it (HTTP 429) without saying how long
#: (no ``Retry-After``): a minute, the window most providers' rate limits count in.
THROTTLE_DEFAULT_SECONDS = 60.0


class FlowFeedback:
    """What an outcome tells its channel's flow control: throttling pauses it, failures may open its circuit.

    Called on the worker's thread (an inline channel's outcome in its claim's task of the send loop);
    returns the queued records the channel must not send now (they are given back or rescheduled).
    """

    def __init__(self, monotonic: Callable[[], float], bound: FilteringBoundLogger | None) -> None:
        self.monotonic = monotonic
        self.bound = bound

    def account(
        self, rt: ChannelRuntime, outcome: Outcome, now_mono: float | None = None
    ) -> list[ClaimedRecord]:
        now_mono = self.monotonic() if now_mono is None else now_mono
        if outcome.result == SENT:
            rt.breaker.success()
            return []
        if throttles(outcome):
            pause = outcome.retry_after or THROTTLE_DEFAULT_SECONDS
            if now_mono + pause > rt.paused_until:
                rt.paused_until, rt.paused_at = now_mono + pause, now_mono
            rt.breaker.neutral()
            (self.bound or log).warning(
                "channel-throttled", channel=rt.config.key, pause_s=round(pause, 3), deferred=len(rt.queue)
            )
            # A channel with a fallback keeps its queue: the fallback sends it, or it is handed back then.
            return take_queue(rt) if rt.fallback is None else []
        if not outcome.retriable:
            rt.breaker.neutral()
            return []
        if rt.breaker.failure(now_mono) == rt.breaker.OPEN and rt.fallback is None:
            # Records claimed but not started keep their attempt budget through the cool-down: they
            # are given back instead of being sent into an outage.
            return take_queue(rt)
        return []

    def account_safely(self, rt: ChannelRuntime, outcome: Outcome, at: float) -> list[ClaimedRecord]:
        """:meth:`account` for a call's slot: an error in flow control is logged, and never loses the
        outcome or the slot's count."""
        try:
            return self.account(rt, outcome, at)
        except Exception as exc:
            log.error("flow-control-failed", channel=rt.key, error=f"{type(exc).__name__}: {exc}")
            return []


def throttles(outcome: Outcome) -> bool:
    """Whether the provider asked the whole channel to wait (else a failure counts for the circuit)."""
    return outcome.error_kind == THROTTLED or bool(outcome.retriable and outcome.retry_after)


def take_queue(rt: ChannelRuntime) -> list[ClaimedRecord]:
    """Empty a channel's queue of claimed, unstarted records and return them."""
    taken = list(rt.queue)
    rt.queue.clear()
    if rt.tenants is not None:
        rt.tenants.forget(taken)
    return taken


@dataclasses.dataclass(slots=True)
class Returned:
    """Queued records a channel could no longer send after ``cause`` (its circuit opened, it was paused):
    what :meth:`FlowFeedback.account` handed back, and when (``at``, monotonic)."""

    rt: ChannelRuntime
    cause: Outcome
    records: list[ClaimedRecord]
    at: float


def sort_returns(returns: Iterable[Returned]) -> tuple[list[Returned], list[ClaimedRecord]]:
    """The records ``returns`` hand back: those a throttle holds back (with their channel and pause),
    and those simply given back (a circuit opened)."""
    held: list[Returned] = []
    given_back: list[ClaimedRecord] = []
    for returned in returns:
        if not returned.records:
            continue
        if throttles(returned.cause):
            held.append(returned)
        else:
            given_back.extend(returned.records)
    return held, given_back


# --------------------------------------------------------------------------------------------------
# A worker's own cap on calls in flight across all its channels (``WORKER_MAX_IN_FLIGHT``).
#
# A channel's ``max_concurrency`` protects its provider and is a total over every worker; this cap protects
# the worker's process (its sockets, memory and event loop), whatever the channels add up to. Every channel
# runtime of a worker shares one :class:`InFlightCap`: a send starts only while the worker has a free slot,
# and claims are sized so that the worker keeps about ``QUEUE_ROUNDS`` rounds queued behind its calls, as a
# single channel does, never that much per channel.
#
# A call keeps its slot after it ends, until its outcome is committed (or dropped): a worker killed at any
# moment has sent again, after its leases run out, no more than its cap of calls. The completer commits at
# once whenever a send waits for a slot that an uncommitted outcome holds (engine.completer), so the slot is
# back after one commit's round trip, not after the batch delay.
# --------------------------------------------------------------------------------------------------


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
