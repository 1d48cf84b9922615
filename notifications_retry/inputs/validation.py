"""What the public API accepts, checked before anything reaches the database; recipients as the
suppression list compares them.

A bad field raises :class:`InvalidNotification`, a ``ValueError`` whose ``field`` names it and whose
message starts with it (``"payload["items"][3]: NaN is not a JSON number"``). The first bad field
found is reported; nothing is written. Without these checks the same input reached PostgreSQL raw
(a NUL byte or a 65-character type: a psycopg ``DataError``), failed deep in Python (a 100,000-deep
payload: ``RecursionError``) or was stored as is (a 20 MB payload, sent on every attempt).

The payload walk is iterative: a payload nested far past Python's recursion limit gets the same clean
error as one nested a level too deep. The model's field validators (``full_clean``) apply the same
rules through :func:`reject_unstorable_text` and :func:`reject_invalid_payload`.

Recipients as the suppression list stores them (:func:`normalize_recipient`, used on every side of
the check): an email address compares as the ESPs compare it, whole, without case (``Ann@Example.COM``
and ``ann@example.com`` are one mailbox to Postmark, Mailgun, SES and SendGrid, and to their own
suppression lists), its surrounding whitespace and display name dropped. A recipient that is not an
email address (a phone number, a device token, a user id) is kept verbatim: a push token or a user id
may tell its cases apart, and nothing reports on those channels with another spelling. The worker's
claim, the requeue, the API, the admin and the ESP receiver all normalize through here, so a
suppression written by one is found by the others. Only the comparison uses this form: a notification
is still sent to its recipient as written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from email.utils import parseaddr
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator

from notifications_retry.conf import bounds

__all__ = [
    "InvalidArgumentType",
    "InvalidNotification",
    "check_payload",
    "check_priority",
    "check_text",
    "normalize_recipient",
    "range_validators",
    "reject_invalid_payload",
    "reject_unstorable_text",
    "validate_notification",
]


class InvalidNotification(ValueError):
    """One field of a notification cannot be stored; ``field`` names it (a path inside the payload)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidArgumentType(InvalidNotification, TypeError):
    """An argument of the wrong type: an :class:`InvalidNotification` that is also a ``TypeError``."""


def text_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text or inside jsonb, or None."""
    if "\x00" in value:
        return "contains a NUL byte (PostgreSQL text cannot hold one)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid UTF-8)"
    return None


def check_text(field: str, value: object, *, max_length: int, allow_empty: bool = True) -> str:
    """``value`` as a storable string of at most ``max_length`` characters."""
    if not isinstance(value, str):
        raise InvalidArgumentType(field, f"must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise InvalidNotification(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidNotification(field, f"is {len(value)} characters long; at most {max_length} fit")
    problem = text_problem(value)
    if problem:
        raise InvalidNotification(field, problem)
    return value


def check_priority(value: object) -> int:
    """``value`` as a priority the column can hold."""
    if not bounds.PRIORITY.contains(value):
        raise (InvalidNotification if isinstance(value, int) else InvalidArgumentType)(
            "priority", f"must be {bounds.PRIORITY.describe()}, got {value!r}"
        )
    assert isinstance(value, int)
    return value


def _path(parts: tuple[str | int, ...]) -> str:
    return "payload" + "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]" for part in parts)


def _scalar_size(value: object) -> int:
    """A lower bound of the bytes ``value`` takes in compact JSON (to stop early on huge payloads)."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() * 3 // 10 + 1  # log10(2) ~ 0.301: the digits it will need
    return 1


def check_payload(value: object, *, max_bytes: int, max_depth: int) -> dict[str, Any]:
    """``value`` as a JSON object of at most ``max_bytes`` (compact UTF-8 JSON) and ``max_depth`` levels.

    Only dict (string keys), list, str, int, float (finite), bool and None are accepted: the values a
    JSON document can hold and that read back unchanged. Depth counts containers: ``{"a": [1]}`` is 2.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentType("payload", f"must be a JSON object (a dict), got {type(value).__name__}")
    payload = dict(value)
    size = 2
    # (container, its depth, its path) — an explicit stack, so no input can exhaust Python's.
    stack: list[tuple[dict[Any, Any] | list[Any], int, tuple[str | int, ...]]] = [(payload, 1, ())]
    while stack:
        container, depth, path = stack.pop()
        items: Any = container.items() if isinstance(container, dict) else enumerate(container)
        for key, item in items:
            if isinstance(container, dict):
                if not isinstance(key, str):
                    raise InvalidNotification(
                        _path(path),
                        f"has a key of type {type(key).__name__} ({key!r}); JSON keys are strings",
                    )
                problem = text_problem(key)
                if problem:
                    raise InvalidNotification(_path(path), f"has a key that {problem}")
                size += len(key) + 4
            else:
                size += 1
            here = (*path, key)
            if isinstance(item, dict | list):
                if depth + 1 > max_depth:
                    raise InvalidNotification(
                        _path(here), f"nests deeper than {max_depth} levels (MAX_PAYLOAD_DEPTH)"
                    )
                stack.append((item, depth + 1, here))
                size += 2
            elif isinstance(item, str):
                problem = text_problem(item)
                if problem:
                    raise InvalidNotification(_path(here), problem)
                size += _scalar_size(item)
            elif isinstance(item, float):
                if not math.isfinite(item):
                    raise InvalidNotification(_path(here), f"{item!r} is not a JSON number")
                size += 1
            elif item is None or isinstance(item, int):
                size += _scalar_size(item)
            else:
                raise InvalidNotification(
                    _path(here),
                    f"{type(item).__name__} is not a JSON value (dict, list, str, int, float, bool, None)",
                )
            if size > max_bytes:
                raise _too_large(f"more than {max_bytes}", max_bytes)
    try:
        encoded = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:  # an int too long for str() (sys.set_int_max_str_digits)
        raise InvalidNotification("payload", f"cannot be encoded as JSON: {exc}") from None
    encoded_size = len(encoded.encode("utf-8"))
    if encoded_size > max_bytes:
        raise _too_large(str(encoded_size), max_bytes)
    return payload


def _too_large(size: str, max_bytes: int) -> InvalidNotification:
    return InvalidNotification(
        "payload", f"is {size} bytes as JSON; at most {max_bytes} are accepted (MAX_PAYLOAD_BYTES)"
    )


def validate_notification(
    *,
    recipient: object,
    payload: object,
    notification_type: object,
    priority: object,
    correlation_id: object,
    max_payload_bytes: int,
    max_payload_depth: int,
) -> dict[str, Any]:
    """Check every field :func:`notifications_retry.api.create_notification` stores; returns the payload."""
    check_text("recipient", recipient, max_length=bounds.RECIPIENT_MAX_LENGTH, allow_empty=False)
    check_text("notification_type", notification_type, max_length=bounds.NOTIFICATION_TYPE_MAX_LENGTH)
    check_text("correlation_id", correlation_id, max_length=bounds.CORRELATION_ID_MAX_LENGTH)
    check_priority(priority)
    return check_payload(payload, max_bytes=max_payload_bytes, max_depth=max_payload_depth)


# --- the same rules as Django field validators (model full_clean, forms, the admin) ---------------


def reject_unstorable_text(value: object) -> None:
    """Field validator: a string PostgreSQL cannot store (NUL byte, lone surrogate)."""
    problem = text_problem(value) if isinstance(value, str) else None
    if problem:
        raise ValidationError(f"This value {problem}.", code="unstorable_text")


def reject_invalid_payload(value: object) -> None:
    """Field validator: the payload rules of the API, with the current ``MAX_PAYLOAD_*`` settings."""
    from notifications_retry.conf import get_settings

    conf = get_settings()
    try:
        check_payload(value, max_bytes=conf.MAX_PAYLOAD_BYTES, max_depth=conf.MAX_PAYLOAD_DEPTH)
    except InvalidNotification as exc:
        raise ValidationError(str(exc), code="invalid_payload") from None


def reject_non_finite(value: object) -> None:
    """Field validator: NaN passes both Min- and MaxValueValidator (it compares false); refuse it here."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValidationError("Enter a finite number.", code="non_finite")


def range_validators(bound: bounds.Bound) -> list[Any]:
    """Field validators for a closed range of :mod:`notifications_retry.conf.bounds`."""
    return [MinValueValidator(bound.low), MaxValueValidator(bound.high), reject_non_finite]


# --- recipients as the suppression list stores them -----------------------------------------------

#: Characters that only a display name, a comment or a quoted local part brings: such a recipient is
#: read by the email package's parser; any other is split at its last ``@`` (the claim normalizes a
#: whole batch of recipients, and the parser costs about 30 times as much).
_NEEDS_PARSER = re.compile(r'[<>"(),;]')
_SPACE = re.compile(r"\s")


def _split(recipient: str) -> tuple[str, str] | None:
    """(local part, domain) of an email address, or None for anything else."""
    text = recipient.strip()
    if _NEEDS_PARSER.search(text):
        _, text = parseaddr(text)
    local, at, domain = text.rpartition("@")
    if not (at and local and domain) or "@" in local or _SPACE.search(text):
        return None
    return local, domain


def normalize_recipient(recipient: str) -> str:
    """The form the suppression list stores and compares: an email address case-folded whole, else verbatim.

    ``"Ann <Ann@Example.COM>"`` and ``" ann@example.com "`` become ``"ann@example.com"``;
    ``"+15551234567"`` and ``"device-Token"`` stay as they are.
    """
    if not isinstance(recipient, str):
        raise TypeError(f"recipient must be a string, got {type(recipient).__name__}")
    parts = _split(recipient)
    if parts is None:
        return recipient
    return f"{parts[0]}@{parts[1]}".casefold()
