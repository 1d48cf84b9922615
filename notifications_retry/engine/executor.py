"""The executor: calls a channel's provider for one record and turns its answer into an outcome.

Whatever the provider returns or raises becomes that record's outcome (never a lost task): a
:class:`~notifications_retry.exceptions.ProviderError` keeps its kind, retriability and Retry-After;
anything else is a retriable ``provider_crash``; a call that outlives the channel's timeout is a
retriable ``timeout``. The retry decision itself is :func:`notifications_retry.rules.outcomes.decide`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.observability import tracing
from notifications_retry.observability.excerpts import masked
from notifications_retry.providers import OutgoingMessage, Provider
from notifications_retry.providers.base import SendResult
from notifications_retry.rules.outcomes import (
    INVALID_RECIPIENT,
    NO_ANSWER,
    SENT,
    TIMEOUT,
    ClaimedRecord,
    Evidence,
    Failure,
    Outcome,
    attempt_budget,
    decide,
    evidence_of,
    failure_of,
    outcome_of,
)
from notifications_retry.runtime.asyncio_bridge import deadline
from notifications_retry.runtime.clock import Clock

#: The grace after a timeout, the only one: a provider call that outlives its channel timeout by this much
#: is abandoned as a timeout, and a tick that stopped claiming waits no longer for its calls.
ABANDON_GRACE_SECONDS = 0.5


def abandoned_after(timeout_seconds: float) -> float:
    """How long a call of a channel whose timeout is ``timeout_seconds`` runs at most: past its timeout
    and :data:`ABANDON_GRACE_SECONDS`, it is abandoned as a timeout (the executor's deadline), and the
    tick waits for it no longer."""
    return float(timeout_seconds) + ABANDON_GRACE_SECONDS


def calls_bound_seconds(runtimes: Iterable[ChannelRuntime]) -> float:
    """How long the calls of these channels run at most: :func:`abandoned_after` the largest timeout."""
    return abandoned_after(max((float(rt.config.timeout_seconds) for rt in runtimes), default=0.0))


class Executor:
    """Sends records through their channel's provider; every path ends in an :class:`Outcome`."""

    def __init__(
        self,
        *,
        clock: Clock,
        rng: random.Random,
        monotonic: Callable[[], float],
        attempts_by_type: Mapping[str, int],
        threads: int,
    ) -> None:
        self.clock = clock
        self.rng = rng
        self.monotonic = monotonic
        self.attempts_by_type = attempts_by_type
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None
        # The running tick's id and trace context, for record spans started on the send loop's thread.
        self.run_id: str | None = None
        self.trace_parent: Any = None
        self.tracing = False

    def begin_tick(self, run_id: str) -> None:
        self.run_id, self.trace_parent = run_id, tracing.current_context()
        # Whether record spans are built, decided once a tick (asking costs an environment lookup).
        self.tracing = tracing.enabled()

    # -- outcomes ------------------------------------------------------------------------------

    def failed(
        self,
        rt: ChannelRuntime,
        record: ClaimedRecord,
        failure: Failure,
        started: float,
        evidence: Evidence | None = None,
    ) -> Outcome:
        """The outcome of an attempt that ended with ``failure``, as :func:`decide` rules."""
        budget = attempt_budget(
            rt.config.max_attempts, rt.config.key, record.notification_type, self.attempts_by_type
        )
        decision = decide(
            failure,
            attempts=record.attempts,
            budget=budget,
            now=self.clock.now(),
            policy=rt.policy,
            rng=self.rng,
        )
        if evidence is not None:  # the answer's text, masked here: a provider cannot use the masking code
            evidence = masked(evidence, recipient=record.recipient, payload=record.payload)
        return outcome_of(record, decision, failure=failure, duration_ms=self._ms(started), evidence=evidence)

    def sent(self, record: ClaimedRecord, result: SendResult, started: float) -> Outcome:
        # A delivery needs no decision (decide(None, ...) is always SENT): skipped on the hot path.
        return Outcome(
            record,
            SENT,
            provider_message_id=result.provider_message_id,
            duration_ms=self._ms(started),
            evidence=result.evidence or NO_ANSWER,
        )

    def raised(
        self, rt: ChannelRuntime, record: ClaimedRecord, exc: BaseException, started: float
    ) -> Outcome:
        """Classify what a provider call raised: its error's kind, else a retriable crash."""
        return self.failed(rt, record, failure_of(exc), started, evidence_of(exc))

    def _ms(self, started: float) -> float:
        return (self.monotonic() - started) * 1000

    # -- sending -------------------------------------------------------------------------------

    def message(self, rt: ChannelRuntime, record: ClaimedRecord, started: float) -> OutgoingMessage | Outcome:
        """What to send for ``record``, or its outcome when nothing can be sent."""
        if not isinstance(record.recipient, str) or not record.recipient.strip():
            # No provider can deliver to nobody: a permanent failure, without a call.
            failure = Failure(INVALID_RECIPIENT, f"recipient {record.recipient!r} is empty", retriable=False)
            return self.failed(rt, record, failure, started)
        return OutgoingMessage.of(record, rt.config.key)

    def send(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        """Send one record on this thread (an inline provider), in its own span."""
        started = self.monotonic()
        with self._record_span(rt, record) as span:
            message = self.message(rt, record, started)
            if isinstance(message, Outcome):
                return _end_span(span, message)
            try:
                with self._provider_span(rt, record):
                    result = rt.provider.send(message)
            except Exception as exc:
                return _end_span(span, self.raised(rt, record, exc, started))
            return _end_span(span, self.sent(record, result, started))

    async def send_async(self, rt: ChannelRuntime, record: ClaimedRecord) -> Outcome:
        """Send one record on the send loop: awaited if the provider is asynchronous, else on a thread.

        A call that outlives its channel's timeout (plus a grace period) is abandoned as a timeout;
        a synchronous provider's thread is left to finish on its own.
        """
        started = self.monotonic()
        if not self.tracing:  # no span to open or close (a context manager each, twice a call)
            try:
                message = self.message(rt, record, started)
                if isinstance(message, Outcome):
                    return message
                return await self._call(rt, record, message, started)
            except BaseException as exc:
                if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
                return self.raised(rt, record, exc, started)
        with self._record_span(rt, record) as span:
            try:
                message = self.message(rt, record, started)
                if isinstance(message, Outcome):
                    return _end_span(span, message)
                return _end_span(span, await self._call(rt, record, message, started))
            except BaseException as exc:
                if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                    raise
                return _end_span(span, self.raised(rt, record, exc, started))

    async def _call(
        self, rt: ChannelRuntime, record: ClaimedRecord, message: OutgoingMessage, started: float
    ) -> Outcome:
        provider = rt.provider
        is_async = provider.supports_async
        # A provider that bounds its own calls by the channel's timeout needs no timer of ours.
        if is_async and provider.enforces_timeout:
            try:
                if self.tracing:
                    with self._provider_span(rt, record):
                        result = await provider.send_async(message)
                else:
                    result = await provider.send_async(message)
            except Exception as exc:
                return self.raised(rt, record, exc, started)
            return self.sent(record, result, started)
        watchdog: asyncio.Timeout | None = None
        try:
            with self._provider_span(rt, record):
                # An answer that came back while the process was paused counts (not a timeout).
                async with deadline(abandoned_after(rt.config.timeout_seconds)) as watchdog:
                    if is_async:
                        result = await provider.send_async(message)
                    else:
                        result = await self._await(provider, message)
        except Exception as exc:
            if watchdog is not None and watchdog.expired():
                timeout = f"provider did not return within {rt.config.timeout_seconds:g}s"
                failure = Failure(TIMEOUT, timeout, retriable=True)
                return self.failed(rt, record, failure, started, NO_ANSWER)
            return self.raised(rt, record, exc, started)
        return self.sent(record, result, started)

    async def _await(self, provider: Provider, message: OutgoingMessage) -> SendResult:
        """Await an asynchronous provider; run a synchronous one on the thread pool."""
        if provider.supports_async:
            return await provider.send_async(message)
        return await asyncio.get_running_loop().run_in_executor(self._executor(), provider.send, message)

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=self._threads, thread_name_prefix="notifications-retry-send"
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- tracing -------------------------------------------------------------------------------

    def _record_span(self, rt: ChannelRuntime, record: ClaimedRecord) -> Any:
        """A record's span, parented to the tick's span even from the send loop's thread."""
        if not self.tracing:
            return tracing.NO_SPAN
        return tracing.span(
            "notifications_retry.record",
            parent=self.trace_parent,
            **{
                "job_run_id": self.run_id,
                "notification.id": str(record.id),
                "notification.channel": rt.config.key,
                "notification.attempt": record.attempts,
                "tenant.id": record.tenant_id,
                "correlation_id": record.correlation_id or None,
            },
        )

    def _provider_span(self, rt: ChannelRuntime, record: ClaimedRecord) -> Any:
        if not self.tracing:
            return tracing.NO_SPAN
        return tracing.span(
            "notifications_retry.provider.send",
            **{
                "notification.id": str(record.id),
                "notification.channel": rt.config.key,
                "notification.attempt": record.attempts,
                "correlation_id": record.correlation_id or None,
                "provider.key": rt.config.provider_key,
                "job_run_id": self.run_id,
            },
        )


def _end_span(span: Any, outcome: Outcome) -> Outcome:
    if span is None:
        return outcome
    tracing.set_attributes(
        span,
        **{"notification.outcome": outcome.result, "notification.error_kind": outcome.error_kind or None},
    )
    return outcome
