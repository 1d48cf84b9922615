"""Errors a provider raises to classify a failed send, and configuration errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from notifications_retry.evidence import Evidence


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
    #: The answer behind the failure, when the provider got one (notifications_retry.evidence).
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
