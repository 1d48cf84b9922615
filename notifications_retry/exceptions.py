"""The app's errors, and reading an exception.

Errors: those a provider raises to classify a failed send, and configuration errors.

Reading: Django wraps the driver's error, aiohttp keeps the OS error it met, urllib3 the reason of a
failed retry: whoever looks for one kind of error in there (a refused address, a SQLSTATE, a connect
that failed) walks them all with :func:`causes`. Log lines and check messages quote an error by
:func:`first_line` (or :func:`message_line`), never with its traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from notifications_retry.rules.outcomes import Evidence


class NotificationsRetryError(Exception):
    """Base of every error this app raises."""


class ProviderError(NotificationsRetryError):
    """A send failed; ``kind`` is a low-cardinality label (metrics, dead-letter triage).

    ``ambiguous`` says whether the message may have been delivered all the same (a timeout after the
    request was sent, a connection dropped mid-answer). It is True unless the raise site knows that
    nothing can have gone out (connection refused, DNS failure, an explicit refusal answered before
    processing): only such an *unambiguous* failure may be handed to another provider, since two
    providers cannot deduplicate against each other. The default is the safe one.
    """

    retriable: bool = True
    default_kind: str = "provider_error"
    #: The answer behind the failure, when the provider got one (notifications_retry.rules.outcomes).
    evidence: Evidence | None = None

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        retry_after: float | None = None,
        ambiguous: bool = True,
    ) -> None:
        super().__init__(message)
        self.kind = kind or self.default_kind
        # Seconds the provider asked us to wait (Retry-After); the earliest next attempt.
        self.retry_after = retry_after
        self.ambiguous = ambiguous


class RetryableProviderError(ProviderError):
    """Temporary failure: timeout, connection error, 5xx, throttling. Retried with backoff."""

    retriable = True
    default_kind = "retriable"


class ProviderThrottled(RetryableProviderError):
    """The provider asked us to slow down (HTTP 429 or 503 with Retry-After)."""

    default_kind = "throttled"


class PermanentProviderError(ProviderError):
    """Failure that will not heal by retrying: invalid address, revoked template, 4xx."""

    retriable = False
    default_kind = "permanent"


class ChannelConfigurationError(NotificationsRetryError):
    """A channel's configuration cannot work (unknown provider key, missing option)."""


class InvalidTransition(NotificationsRetryError):
    """A dead-letter operation was asked of a record in the wrong state."""


def causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every error it wraps, each once, outermost first.

    Followed: ``__cause__``, ``__context__``, an ``os_error`` or ``reason`` attribute holding an
    exception, and exceptions among its ``args``.
    """
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        current = stack.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        linked = [
            current.__cause__,
            current.__context__,
            getattr(current, "os_error", None),
            getattr(current, "reason", None),
            *current.args,
        ]
        stack.extend(reversed(linked))


def message_line(exc: BaseException) -> str:
    """The first line of the error's message (its type's name when the message is empty)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The error in one line: its type and the first line of its message."""
    if not str(exc).strip():
        return type(exc).__name__
    return f"{type(exc).__name__}: {message_line(exc)}"
