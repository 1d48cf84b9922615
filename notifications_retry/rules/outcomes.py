"""What happens to a record after an attempt: one pure :func:`decide`, the records it decides on, and
the evidence an attempt left.

The worker (after a provider call), the claim (a record whose budget is spent or whose deadline
passed before its send), the dispatcher's hand-off API and cancel all go through :func:`decide`, so
the rules "a permanent failure is terminal", "the last allowed attempt is terminal" and "a retry
waits for the backoff and never less than the provider's Retry-After" live here and nowhere else.
Nothing here touches the database, the clock or randomness: they are parameters.

Evidence: the answer's status, an excerpt of it, and where it came from. A provider attaches an
:class:`Evidence` to its :class:`~notifications_retry.providers.base.SendResult` or to the
:class:`~notifications_retry.exceptions.ProviderError` it raises; the executor copies it onto the
:class:`Outcome`, and finalize writes it into the attempt's ``attempt_log`` entry (``status_code``,
``duration_ms``, ``response_excerpt``, ``remote_addr``, ``trigger``). A provider hands over the
answer's text as received (:func:`answer_text`: at most a few KiB, the channel's own secrets already
cut out by value); the caller that builds the outcome (the executor, ``api.send_now``) masks it like
a log line and cuts it to :data:`EXCERPT_BYTES` bytes
(:func:`notifications_retry.observability.excerpts.masked`), since only it may use the masking code.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from notifications_retry.conf import bounds
from notifications_retry.exceptions import ProviderError
from notifications_retry.rules.backoff import BackoffPolicy, next_attempt_at

SENT = "sent"
RETRY = "retry"
TERMINAL = "terminal"

#: Error kinds the app assigns itself (providers add their own).
EXHAUSTED = "attempts_exhausted"
ATTEMPTS_INVALID = "attempts_invalid"
EXPIRED = "expired"
UNDECODABLE = "undecodable_payload"
PAYLOAD_TOO_LARGE = "payload_too_large"
PAYLOAD_INVALID = "payload_invalid"
#: A time Python's datetime cannot hold ('infinity', year 12000), written past the API: set aside unsent.
UNREADABLE_TIME = "unreadable_time"
CANCELLED = "cancelled"
PROVIDER_CRASH = "provider_crash"
TIMEOUT = "timeout"
THROTTLED = "throttled"
INVALID_RECIPIENT = "invalid_recipient"
#: The recipient is on the suppression list: terminal before any attempt (no provider call).
SUPPRESSED = "suppressed"
#: A permanent SMTP reply that names the recipient itself (5.1.1, 5.1.10, 5.2.1): it also suppresses it.
MAILBOX_UNAVAILABLE = "mailbox_unavailable"

#: No attempt count above this comes from the app: it is the largest budget a channel or a type may have,
#: and a claim counts an attempt only below its budget (a requeue starts again from 0).
ATTEMPTS_LIMIT = int(bounds.MAX_ATTEMPTS.high)
#: The claim clamps deadlines Python cannot hold to this floor ('-infinity', years before 1).
DEADLINE_FLOOR = datetime(1, 1, 2, tzinfo=UTC)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


#: At most this many bytes of an answer are kept per attempt (1 KiB, the public contract).
EXCERPT_BYTES = 1024
#: What started an attempt: the worker's due retry or deferred send; the first attempt after an
#: operator's requeue; the first after a recovery job's requeue; the monolith's own send, handed over.
SCHEDULED, MANUAL, REPLAY, HANDOFF = "scheduled", "manual", "replay", "handoff"
TRIGGERS = (SCHEDULED, MANUAL, REPLAY, HANDOFF)
#: Characters of an answer handed over at most: enough for the excerpt once masking has shortened it.
READ_CHARS = 4 * EXCERPT_BYTES


@dataclasses.dataclass(frozen=True, slots=True)
class Evidence:
    """One provider call's answer: ``status_code`` None when no answer came (timeout, refused)."""

    status_code: int | None = None
    response_excerpt: str = ""
    remote_addr: str | None = None

    def log_fields(self) -> dict[str, Any]:
        """The ``attempt_log`` keys this evidence fills."""
        return {
            "status_code": self.status_code,
            "response_excerpt": self.response_excerpt,
            "remote_addr": self.remote_addr,
        }


#: A call that got no answer, and no address is known.
NO_ANSWER = Evidence()


def evidence_of(exc: BaseException) -> Evidence:
    """What a provider call that raised ``exc`` left: the error's evidence, else no answer."""
    found = getattr(exc, "evidence", None)
    return found if isinstance(found, Evidence) else NO_ANSWER


def answer_text(answer: bytes | str | None, *, secrets: Iterable[str] = ()) -> str:
    """The start of an answer as text, with ``secrets`` (a channel's own) cut out by value."""
    if not answer:
        return ""
    text = (
        answer[:READ_CHARS].decode("utf-8", "replace") if isinstance(answer, bytes) else answer[:READ_CHARS]
    )
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


@dataclasses.dataclass
class ClaimedRecord:
    """A leased record, detached from the ORM; ``attempts`` already counts this attempt."""

    id: uuid.UUID
    tenant_id: uuid.UUID | None
    channel_id: int
    recipient: Any
    payload: Any
    notification_type: str
    priority: int
    status: str
    attempts: int
    expires_at: datetime | None
    correlation_id: str
    requeue_count: int
    claim_token: uuid.UUID | None
    #: When the lease ends, by the worker's clock (``None``: settled inside its claim, no lease).
    lease_expires_at: datetime | None = None
    #: The worker's monotonic time after which the lease can no longer cover a call started on it
    #: (engine.claiming sets it as the record is queued; engine.channels gives it back unsent then).
    start_by: float = math.inf

    # The ids as text, made once: a record's id goes into its lease, its outcome's row, its event
    # (key and payload) and its log line, and each str() of a UUID costs about half a microsecond.
    @functools.cached_property
    def id_text(self) -> str:
        """``id`` as text (hyphenated, lower case)."""
        return str(self.id)

    @functools.cached_property
    def tenant_text(self) -> str | None:
        """``tenant_id`` as text; None for the null tenant."""
        return str(self.tenant_id) if self.tenant_id else None


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why an attempt did not deliver: the error kind, its text, and whether trying again may help."""

    kind: str
    error: str
    retriable: bool
    #: Seconds the provider asked to wait (Retry-After), already clamped by the provider.
    retry_after: float | None = None
    #: Whether the message may be out all the same (see ``ProviderError.ambiguous``): only an
    #: unambiguous failure may be handed to a fallback channel.
    ambiguous: bool = True


@dataclasses.dataclass(frozen=True)
class Decision:
    """What :func:`decide` says: sent, retry at a time, or terminal with a reason."""

    result: str
    next_attempt_at: datetime | None = None
    error_kind: str = ""
    error: str = ""


@dataclasses.dataclass
class Outcome:
    """What happened to one claimed record, ready to be applied under its claim token."""

    record: ClaimedRecord
    result: str
    provider_message_id: str | None = None
    error_kind: str = ""
    error: str = ""
    next_attempt_at: datetime | None = None
    duration_ms: float = 0.0
    #: Seconds the provider asked to wait (Retry-After), and whether the failure was temporary.
    retry_after: float | None = None
    retriable: bool = False
    #: Whether the failure may have delivered all the same (False only when nothing can be out).
    ambiguous: bool = True
    #: The channel whose provider delivered it, when not the record's own (a failover).
    delivered_by: str | None = None
    #: The provider call's answer; None when no provider was called (expired, budget spent, cancelled).
    evidence: Evidence | None = None
    #: What started the attempt (one of TRIGGERS); None: finalize reads it from the row.
    trigger: str | None = None
    #: A failed probe of its channel's circuit breaker (the one call let through per cool-down): how long
    #: the circuit had been open, with no success since, when the probe ended (seconds; None: not a
    #: failed probe). Endpoint health then judges on fewer calls (endpoint_health.Thresholds.needed).
    circuit_open_for: float | None = None

    @property
    def emits_event(self) -> bool:
        return self.result in (SENT, TERMINAL)


def attempt_budget(
    channel_max: int, channel_key: str, notification_type: str, by_type: Mapping[str, int]
) -> int:
    """Attempts allowed: ``ATTEMPTS_BY_TYPE["channel:type"]``, else ``["type"]``, else the channel's."""
    if notification_type:
        for key in (f"{channel_key}:{notification_type}", notification_type):
            if key in by_type:
                return int(by_type[key])
    return channel_max


def decide(
    failure: Failure | None,
    *,
    attempts: int,
    budget: int,
    now: datetime,
    policy: BackoffPolicy,
    rng: random.Random,
) -> Decision:
    """The fate of a record whose attempt number ``attempts`` ended with ``failure`` (``None``: delivered).

    A permanent failure is terminal; a temporary one is terminal once the budget is spent, else it
    is retried after the backoff, never before the provider's Retry-After.
    """
    if failure is None:
        return Decision(SENT)
    if not failure.retriable or attempts >= budget:
        return Decision(TERMINAL, error_kind=failure.kind, error=failure.error)
    when = next_attempt_at(attempts, now, rng, policy, failure.retry_after)
    return Decision(RETRY, next_attempt_at=when, error_kind=failure.kind, error=failure.error)


def failure_of(exc: BaseException) -> Failure:
    """What a provider's exception says (docs/contract.md): a ProviderError keeps its kind, retriability,
    Retry-After and ambiguity; anything else is a retriable, ambiguous ``provider_crash``."""
    if isinstance(exc, ProviderError):
        return Failure(exc.kind, str(exc), exc.retriable, exc.retry_after, ambiguous=exc.ambiguous)
    return Failure(PROVIDER_CRASH, f"{type(exc).__name__}: {exc}", retriable=True)


def before_send(
    *,
    attempts_done: int,
    budget: int,
    expires_at: datetime | None,
    now: datetime,
    suppressed: str | None = None,
) -> Failure | None:
    """What stops a due record before its next send, if anything.

    ``suppressed`` says why the recipient is on the suppression list, when it is: nothing is sent to
    it, whatever the budget. ``attempts_done`` attempts were counted already: when that is the whole
    budget, the last one never finished (its worker stopped or crashed during it); past the budget, the
    budget was lowered since; past any budget the app allows (or negative), the count was written by
    something else. A deadline in the past means the message is no longer wanted.
    """
    if suppressed:
        return Failure(SUPPRESSED, suppressed, retriable=False, ambiguous=False)
    if not 0 <= attempts_done <= ATTEMPTS_LIMIT:
        return Failure(
            ATTEMPTS_INVALID,
            f"attempt count {attempts_done} is impossible: the worker counts at most {ATTEMPTS_LIMIT} "
            "attempts (the largest budget), so it was written outside the app; nothing was sent",
            retriable=False,
        )
    if attempts_done > budget:
        return Failure(
            EXHAUSTED,
            f"{attempts_done} attempts already counted, past the attempt budget of {budget} "
            "(the budget was lowered since)",
            retriable=False,
        )
    if attempts_done == budget:
        return Failure(
            EXHAUSTED,
            f"attempt budget of {budget} spent (the last attempt never finished: the worker stopped "
            "or crashed during it)",
            retriable=False,
        )
    if expires_at is not None and expires_at <= now:
        return Failure(EXPIRED, f"{deadline_words(expires_at)} passed before sending", retriable=False)
    return None


def deadline_words(expires_at: datetime) -> str:
    """A deadline as a triager reads it: one stored as '-infinity' or before 1970 says so."""
    if expires_at <= DEADLINE_FLOOR:
        return "deadline -infinity (stored as '-infinity' or a date before year 2)"
    if expires_at < _EPOCH:
        return f"deadline {expires_at.isoformat()} (before 1970, so it was always past)"
    return f"deadline {expires_at.isoformat()}"


def outcome_of(
    record: ClaimedRecord,
    decision: Decision,
    *,
    failure: Failure | None = None,
    provider_message_id: str | None = None,
    duration_ms: float = 0.0,
    delivered_by: str | None = None,
    evidence: Evidence | None = None,
    trigger: str | None = None,
) -> Outcome:
    """The outcome to apply for ``record`` once :func:`decide` has spoken."""
    return Outcome(
        record,
        decision.result,
        provider_message_id=provider_message_id,
        error_kind=decision.error_kind,
        error=decision.error,
        next_attempt_at=decision.next_attempt_at,
        duration_ms=duration_ms,
        retry_after=failure.retry_after if failure else None,
        retriable=failure.retriable if failure else False,
        ambiguous=failure.ambiguous if failure else True,
        delivered_by=delivered_by,
        evidence=evidence,
        trigger=trigger,
    )


__all__ = [
    "ATTEMPTS_INVALID",
    "CANCELLED",
    "EXCERPT_BYTES",
    "EXHAUSTED",
    "EXPIRED",
    "HANDOFF",
    "MAILBOX_UNAVAILABLE",
    "MANUAL",
    "NO_ANSWER",
    "PAYLOAD_INVALID",
    "PAYLOAD_TOO_LARGE",
    "READ_CHARS",
    "REPLAY",
    "RETRY",
    "SCHEDULED",
    "SENT",
    "SUPPRESSED",
    "TERMINAL",
    "TRIGGERS",
    "UNDECODABLE",
    "UNREADABLE_TIME",
    "ClaimedRecord",
    "Decision",
    "Evidence",
    "Failure",
    "Outcome",
    "answer_text",
    "attempt_budget",
    "before_send",
    "deadline_words",
    "decide",
    "evidence_of",
    "failure_of",
    "outcome_of",
]
