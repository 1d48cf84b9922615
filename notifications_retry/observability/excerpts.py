"""An attempt's answer excerpt as ``attempt_log`` keeps it: masked like a log line, at most 1 KiB.

This message's recipient and payload texts are cut out by value, then every email address, phone
number, token and URL secret by pattern (:func:`notifications_retry.observability.logging.redact`),
then the text is cut to :data:`~notifications_retry.rules.outcomes.EXCERPT_BYTES` bytes of UTF-8 at a
character boundary. Only refusals carry an answer (a 2xx keeps none), so the hot path masks nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from notifications_retry.observability.logging import redact
from notifications_retry.rules.outcomes import EXCERPT_BYTES, Evidence

__all__ = ["excerpt", "masked"]


def excerpt(text: str, *, recipient: Any = None, payload: Any = None) -> str:
    """``text`` masked, then cut to at most :data:`EXCERPT_BYTES` bytes."""
    if not text:
        return ""
    text = redact(text, recipient, payload)
    encoded = text.encode()
    if len(encoded) <= EXCERPT_BYTES:
        return text
    return encoded[:EXCERPT_BYTES].decode("utf-8", "ignore")


def masked(evidence: Evidence, *, recipient: Any = None, payload: Any = None) -> Evidence:
    """``evidence`` with its answer text masked and cut (the same object when it has none)."""
    if not evidence.response_excerpt:
        return evidence
    text = excerpt(evidence.response_excerpt, recipient=recipient, payload=payload)
    return dataclasses.replace(evidence, response_excerpt=text)
