"""The public API's arguments besides the stored text and payload: checked by type before any query.

Each check returns the value in the form the API uses, or raises
:class:`~notifications_retry.inputs.validation.InvalidNotification` naming the argument. A value of the wrong
type raises :class:`InvalidArgumentType`, which is also a ``TypeError`` (callers that caught the
``TypeError`` of ``tenant_id=5`` still do). Without these checks a string ``send_at`` failed deep in
Django (``'str' object has no attribute 'utcoffset'``), ``send_at=None`` stored a fresh notification
instead of a scheduled one, and a string of ids was requeued character by character.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from notifications_retry.inputs.validation import InvalidArgumentType, InvalidNotification

__all__ = [
    "InvalidArgumentType",
    "aware_datetime",
    "flag",
    "id_list",
    "optional_aware_datetime",
    "optional_callable",
    "optional_rng",
    "optional_uuid",
    "uuid_of",
]


def _kind(value: object) -> str:
    return f"{type(value).__name__} {value!r}" if len(repr(value)) <= 80 else type(value).__name__


def aware_datetime(field: str, value: object) -> datetime:
    """``value`` as a timezone-aware datetime (the worker compares times in UTC)."""
    if not isinstance(value, datetime):
        raise InvalidArgumentType(field, f"must be an aware datetime, got {_kind(value)}")
    if value.utcoffset() is None:
        raise InvalidNotification(field, f"must be an aware datetime (USE_TZ), got the naive {value!r}")
    return value


def optional_aware_datetime(field: str, value: object) -> datetime | None:
    """None, or ``value`` as a timezone-aware datetime."""
    return None if value is None else aware_datetime(field, value)


def uuid_of(field: str, value: object) -> uuid.UUID:
    """``value`` (a UUID or its string form) as a UUID."""
    if isinstance(value, uuid.UUID):
        return value
    if not isinstance(value, str):
        raise InvalidArgumentType(field, f"must be a UUID (or its string form), got {_kind(value)}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise InvalidNotification(field, f"must be a UUID, got {value!r}") from None


def optional_uuid(field: str, value: object) -> uuid.UUID | None:
    """None, or ``value`` as a UUID."""
    return None if value is None else uuid_of(field, value)


def id_list(field: str, values: object) -> list[uuid.UUID]:
    """An iterable of notification ids as UUIDs; a single string or bytes is refused, not iterated."""
    if isinstance(values, str | bytes | bytearray) or not isinstance(values, Iterable):
        raise InvalidArgumentType(field, f"must be an iterable of notification ids, got {_kind(values)}")
    return [uuid_of(f"{field}[{i}]", value) for i, value in enumerate(values)]


def flag(field: str, value: object) -> bool:
    """``value`` as a bool (``"false"`` would be true)."""
    if not isinstance(value, bool):
        raise InvalidArgumentType(field, f"must be True or False, got {_kind(value)}")
    return value


def optional_callable(field: str, value: object) -> Callable[..., Any] | None:
    """None, or a callable."""
    if value is not None and not callable(value):
        raise InvalidArgumentType(field, f"must be callable, got {_kind(value)}")
    return value


def optional_rng(field: str, value: object) -> random.Random | None:
    """None, or a ``random.Random`` (the jitter's source)."""
    if value is not None and not isinstance(value, random.Random):
        raise InvalidArgumentType(field, f"must be a random.Random, got {_kind(value)}")
    return value
