"""What an attempt left as evidence: the answer's status, an excerpt of it, and where it came from.

A provider attaches an :class:`Evidence` to its :class:`~notifications_retry.providers.base.SendResult`
or to the :class:`~notifications_retry.exceptions.ProviderError` it raises; the executor copies it onto
the outcome, and finalize writes it into the attempt's ``attempt_log`` entry (``status_code``,
``duration_ms``, ``response_excerpt``, ``remote_addr``, ``trigger``).

A provider hands over the answer's text as received (:func:`answer_text`: at most a few KiB, the
channel's own secrets already cut out by value); the caller that builds the outcome (the executor,
``api.send_now``) masks it like a log line and cuts it to :data:`EXCERPT_BYTES` bytes
(:func:`notifications_retry.observability.excerpts.masked`), since only it may use the masking code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

__all__ = [
    "EXCERPT_BYTES",
    "HANDOFF",
    "MANUAL",
    "NO_ANSWER",
    "READ_CHARS",
    "REPLAY",
    "SCHEDULED",
    "TRIGGERS",
    "Evidence",
    "answer_text",
    "evidence_of",
]

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
