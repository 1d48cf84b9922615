"""What an attempt left as evidence: the answer's status, an excerpt of it, and where it came from.

A provider attaches an :class:`Evidence` to its :class:`~notifications_retry.providers.base.SendResult`
or to the :class:`~notifications_retry.exceptions.ProviderError` it raises; the executor copies it onto
the outcome, and finalize writes it into the attempt's ``attempt_log`` entry (SPEC §5: ``status_code``,
``duration_ms``, ``response_excerpt``, ``remote_addr``, ``trigger``).

The excerpt is masked like a log line (this message's recipient and payload texts cut out by value,
then every email address, phone number, token and URL secret by pattern) and any secret the caller
names (a channel's signing secrets, its configured header values) cut out by value, then cut to
:data:`EXCERPT_BYTES` bytes of UTF-8.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from notifications_retry.observability.logging import MASK, redact

__all__ = [
    "EXCERPT_BYTES",
    "HANDOFF",
    "MANUAL",
    "NO_ANSWER",
    "REPLAY",
    "SCHEDULED",
    "TRIGGERS",
    "Evidence",
    "evidence_of",
    "excerpt",
]

#: At most this many bytes of an answer are kept per attempt (SPEC §5: 1 KiB).
EXCERPT_BYTES = 1024
#: What started an attempt: the worker's due retry or deferred send; the first attempt after an
#: operator's requeue; the first after a recovery job's requeue; the monolith's own send, handed over.
SCHEDULED, MANUAL, REPLAY, HANDOFF = "scheduled", "manual", "replay", "handoff"
TRIGGERS = (SCHEDULED, MANUAL, REPLAY, HANDOFF)
# Masking reads this much of an answer at most: enough for the excerpt after masking shortened it.
_READ_CHARS = 4 * EXCERPT_BYTES


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


def excerpt(
    answer: bytes | str | None,
    *,
    recipient: Any = None,
    payload: Any = None,
    secrets: Iterable[str] = (),
) -> str:
    """At most :data:`EXCERPT_BYTES` bytes of ``answer``, masked; ``secrets`` are cut out by value."""
    if not answer:
        return ""
    text = (
        answer[:_READ_CHARS].decode("utf-8", "replace") if isinstance(answer, bytes) else answer[:_READ_CHARS]
    )
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, MASK)
    text = redact(text, recipient, payload)
    encoded = text.encode()
    if len(encoded) <= EXCERPT_BYTES:
        return text
    return encoded[:EXCERPT_BYTES].decode("utf-8", "ignore")
