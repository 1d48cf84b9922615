"""Failover: an attempt a channel's provider could not take goes to the channel's fallback channel.

Two ways in (docs/providers.md#failover):

- **after the call**: the primary's provider failed *unambiguously* and temporarily (connection
  refused, a name that does not resolve, 429/503, an SMTP 4xx at connect or MAIL FROM). Nothing of the
  attempt can be out, so the same attempt (same NotificationId, same attempt number) is sent through
  the fallback's provider. An *ambiguous* failure (a timeout after the request was sent, an answer
  cut off) never fails over: two providers cannot deduplicate against each other, and the message
  may already be out.
- **instead of the call**: the primary must not be called now (its circuit is open, its half-open
  probe is out, or its provider paused it with Retry-After, see ``ChannelRuntime.bypassed``); its
  claimed records go straight to the fallback instead of being held.

The fallback's flow control is respected: nothing goes into its open circuit or while it is paused,
and a call starts only within its concurrency and rate limit (a failover after a call does not wait
for a slot: the record then takes the primary's normal retry). Each provider's answer feeds its own
channel's flow control. When the fallback fails too, the record gets the primary's decision (retry or
terminal, by the primary's budget and backoff), with both errors kept. One hop only: a fallback's own
fallback is never used for another channel's attempt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.executor import Executor
from notifications_retry.engine.flow_control import FlowFeedback, Returned, take_queue
from notifications_retry.observability import metrics
from notifications_retry.rules.outcomes import SENT, THROTTLED, ClaimedRecord, Failure, Outcome

#: Error kind of an attempt whose channel's provider was not called because its circuit is open.
CIRCUIT_OPEN = "circuit_open"


@dataclasses.dataclass(slots=True)
class Rerouted:
    """A claimed record going straight to ``fallback``: ``why`` its own channel was not called."""

    fallback: ChannelRuntime
    record: ClaimedRecord
    why: Failure


def eligible(outcome: Outcome) -> bool:
    """Whether an attempt may go to a fallback: a temporary failure that cannot have delivered anything."""
    return outcome.result != SENT and outcome.retriable and not outcome.ambiguous


def not_called(rt: ChannelRuntime, now_mono: float) -> Failure:
    """Why ``rt``'s provider was not called (the attempt went straight to the fallback)."""
    if now_mono < rt.paused_until:
        wait = rt.paused_until - now_mono
        reason = f"channel {rt.key} paused by its provider for {wait:.1f}s; its provider was not called"
        return Failure(THROTTLED, reason, True, wait, ambiguous=False)
    reason = f"channel {rt.key}'s circuit is open; its provider was not called"
    return Failure(CIRCUIT_OPEN, reason, True, ambiguous=False)


class Failover:
    """Sends attempts through fallback channels, on the worker's thread, which alone changes a fallback's
    state (an inline fallback's records are also settled by claims: tasks of the same loop)."""

    def __init__(
        self,
        executor: Executor,
        feedback: FlowFeedback,
        monotonic: Callable[[], float],
    ) -> None:
        self.executor = executor
        self.feedback = feedback
        self.monotonic = monotonic

    def reserve(self, rt: ChannelRuntime, now_mono: float) -> ChannelRuntime | None:
        """``rt``'s fallback with a call slot taken on it, or None when it cannot take one now.

        A reserved slot is given back by :meth:`send`.
        """
        fallback = rt.fallback
        if fallback is None or not fallback.can_take_failover(now_mono):
            return None
        fallback.begin(now_mono)  # a rate-limit slot, and the probe of a half-open circuit
        fallback.inflight += 1
        return fallback

    def reroute(self, rt: ChannelRuntime) -> tuple[list[Rerouted], list[ClaimedRecord]]:
        """The queued records of a bypassed ``rt`` its fallback takes now,
        and those to give back because the fallback cannot take any (its circuit open, paused).

        Records the fallback is merely too busy for stay queued for its next free slot.
        """
        rerouted: list[Rerouted] = []
        while rt.queue:
            now_mono = self.monotonic()
            if not rt.bypassed(now_mono):
                break  # the channel's own provider may be called again: the dispatcher starts them
            fallback = rt.fallback
            if fallback is None or not fallback.accepts_failover(now_mono):
                return rerouted, take_queue(rt)
            if self.reserve(rt, now_mono) is None:
                break
            record = rt.queue.popleft()
            if rt.tenants is not None:
                rt.tenants.forget([record])  # sent through the fallback: no slot of this channel's
            if now_mono > record.start_by:
                rt.lapsed.append(record)  # its lease could end during the call: given back instead
                continue
            rerouted.append(Rerouted(fallback, record, not_called(rt, now_mono)))
        return rerouted, []

    async def send(
        self, rt: ChannelRuntime, fallback: ChannelRuntime, record: ClaimedRecord, primary: Outcome | Failure
    ) -> tuple[Outcome, Returned]:
        """Send ``record`` through ``fallback`` (a slot reserved); ``primary`` is what ``rt``'s own
        provider answered, or why it was not called. Returns the record's outcome and what the
        fallback's own flow control handed back."""
        started = self.monotonic()
        answer = await self.executor.send_async(fallback, record)
        at = self.monotonic()
        returned = Returned(fallback, answer, self.feedback.account(fallback, answer, at), at)
        fallback.inflight -= 1
        if isinstance(primary, Failure):
            primary = self.executor.failed(rt, record, primary, started)
        delivered = answer.result == SENT
        metrics.FAILOVERS.labels(rt.key, fallback.key, "sent" if delivered else "failed").inc()
        self._log(rt, fallback, record, primary, answer)
        duration_ms = primary.duration_ms + answer.duration_ms
        if delivered:
            outcome = Outcome(
                record,
                SENT,
                provider_message_id=answer.provider_message_id,
                duration_ms=duration_ms,
                delivered_by=fallback.key,
                evidence=answer.evidence,
            )
        else:
            # The primary's decision stands (its budget, its backoff); the fallback's error is kept beside it.
            error = f"{primary.error}; fallback {fallback.key} failed too: {answer.error}"
            outcome = dataclasses.replace(primary, error=error, duration_ms=duration_ms)
        return outcome, returned

    def _log(
        self,
        rt: ChannelRuntime,
        fallback: ChannelRuntime,
        record: ClaimedRecord,
        primary: Outcome,
        answer: Outcome,
    ) -> None:
        bound = self.feedback.bound
        if bound is None:
            return
        bound.warning(
            "item-failed-over",
            notification_id=str(record.id),
            channel=rt.key,
            fallback=fallback.key,
            attempt=record.attempts,
            reason=primary.error_kind,
            delivered=answer.result == SENT,
            fallback_error_kind=answer.error_kind or None,
            correlation_id=record.correlation_id or None,
        )


__all__ = ["CIRCUIT_OPEN", "Failover", "Rerouted", "eligible", "not_called"]
