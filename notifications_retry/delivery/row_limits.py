"""The limits every claimed row is held to, not only the rows the API wrote.

Raw SQL, a restore or a bad migration can leave a 50 MB payload, a 10 MB recipient or a payload that is
not a JSON object. The claim measures them in SQL and returns neither value for such a row, so the worker
never holds it in memory; :func:`set_aside` then says why the row is a dead letter (``payload_too_large``,
``payload_invalid``): no provider call, one event.

Sizes are the API's (:func:`notifications_retry.inputs.validation.check_payload`): the payload as compact JSON
in UTF-8, at most ``MAX_PAYLOAD_BYTES``; the recipient at most ``RECIPIENT_MAX_LENGTH`` characters.
PostgreSQL prints a payload with a space after each ``:`` and ``,``, so its text is at most twice the
compact form: a payload whose text is over twice the limit is refused unread, and one between the limit
and twice it is read (at most twice ``MAX_PAYLOAD_BYTES``) and measured exactly as the API measures.
"""

from __future__ import annotations

import json
from typing import Any

from notifications_retry.conf import bounds
from notifications_retry.rules.outcomes import PAYLOAD_INVALID, PAYLOAD_TOO_LARGE, Failure

RECIPIENT_MAX_LENGTH = bounds.RECIPIENT_MAX_LENGTH
#: lz4 and pglz shrink data at most about 255 and 88 to 1: a stored payload smaller than the limit
#: divided by this cannot be over the limit, and is not measured further.
MAX_COMPRESSION_RATIO = 256

#: The claim's measures, computed in its middle query for the rows within its payload budget only
#: (``s0``: the locked rows with ``within``); ``OFFSET 0`` there keeps each computed once.
MEASURES = f"""
       CASE WHEN s0.within THEN jsonb_typeof(s0.payload) END AS shape,
       CASE WHEN s0.within AND pg_column_size(s0.payload)::bigint * {MAX_COMPRESSION_RATIO} > %(max_payload)s
            THEN octet_length(s0.payload::text) END AS text_size,
       CASE WHEN octet_length(s0.recipient) > {RECIPIENT_MAX_LENGTH} THEN char_length(s0.recipient) END
            AS recipient_chars
"""

#: Whether the claim returns a row's payload: within the budget, an object, not over twice the limit.
PAYLOAD_RETURNED = (
    "s.within AND s.shape = 'object' AND (s.text_size IS NULL OR s.text_size <= 2 * %(max_payload)s)"
)
#: Whether it returns the recipient: not over the limit.
RECIPIENT_RETURNED = f"s.recipient_chars IS NULL OR s.recipient_chars <= {RECIPIENT_MAX_LENGTH}"


def set_aside(
    *, shape: str | None, text_size: int | None, recipient_chars: int | None, payload: Any, max_payload: int
) -> Failure | None:
    """Why a claimed row is not sent at all (its measures from the claim), or None when it may be."""
    if recipient_chars is not None and recipient_chars > RECIPIENT_MAX_LENGTH:
        return Failure(
            PAYLOAD_TOO_LARGE,
            f"recipient is {recipient_chars:,} characters; at most {RECIPIENT_MAX_LENGTH:,} are accepted "
            "(written past the API: nothing was sent)",
            retriable=False,
        )
    if shape is not None and shape != "object":
        return Failure(
            PAYLOAD_INVALID,
            f"payload is a JSON {shape}, not an object (written past the API: nothing was sent)",
            retriable=False,
        )
    if text_size is None or text_size <= max_payload:
        return None
    size = text_size if text_size > 2 * max_payload else _compact_size(payload)
    if size <= max_payload:
        return None
    measured = "as stored" if size == text_size else "as JSON"
    return Failure(
        PAYLOAD_TOO_LARGE,
        f"payload is {size:,} bytes {measured}; at most {max_payload:,} are accepted (MAX_PAYLOAD_BYTES; "
        "written past the API: nothing was sent)",
        retriable=False,
    )


def _compact_size(payload: Any) -> int:
    """The payload's size as the API measures it: compact JSON in UTF-8."""
    encoded = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return len(encoded.encode("utf-8", "surrogatepass"))
