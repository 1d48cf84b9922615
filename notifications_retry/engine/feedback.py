"""Flow-control feedback: what one outcome tells its channel (throttling pauses it, failures may open
its circuit), and which of the channel's queued records it can then no longer send."""

from __future__ import annotations

from collections.abc import Callable

import structlog
from structlog.typing import FilteringBoundLogger

from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.rules.outcomes import SENT, THROTTLED, ClaimedRecord, Outcome

log = structlog.get_logger("notifications_retry.worker")

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
