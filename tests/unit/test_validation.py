"""What the public API accepts: one clear error per bad field, naming it; no database needed."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from typing import Any

import pytest

from notifications_retry.inputs.validation import InvalidNotification, check_payload, validate_notification

LIMITS = {"max_payload_bytes": 256 * 1024, "max_payload_depth": 32}
GOOD: dict[str, Any] = {
    "recipient": "user@example.com",
    "payload": {"title": "Order shipped", "items": [1, 2.5, True, None, {"sku": "A-1"}]},
    "notification_type": "transactional",
    "priority": 5,
    "correlation_id": "req-42",
}


def refused(**changes: Any) -> InvalidNotification:
    with pytest.raises(InvalidNotification) as info:
        validate_notification(**{**GOOD, **changes}, **LIMITS)
    assert isinstance(info.value, ValueError)
    assert str(info.value).startswith(f"{info.value.field}: ")
    return info.value


def nested(depth: int) -> dict[str, Any]:
    """A payload of ``depth`` levels of containers (the top object is level 1)."""
    inner: Any = []
    for _ in range(depth - 2):
        inner = [inner]
    return {"deep": inner} if depth > 1 else {}


def test_good_input_passes_and_the_payload_comes_back_as_a_dict() -> None:
    assert validate_notification(**GOOD, **LIMITS) == GOOD["payload"]
    assert validate_notification(**{**GOOD, "payload": None}, **LIMITS) == {}


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    [
        ({"recipient": "user\x00@example.com"}, "recipient", "NUL byte"),
        ({"recipient": ""}, "recipient", "must not be empty"),
        ({"recipient": 42}, "recipient", "must be a string, got int"),
        ({"recipient": "x" * 4097}, "recipient", "4097 characters long; at most 4096"),
        ({"recipient": "caf\udce9"}, "recipient", "lone surrogate"),
        ({"notification_type": "mark\x00eting"}, "notification_type", "NUL byte"),
        ({"notification_type": "t" * 65}, "notification_type", "65 characters long; at most 64"),
        ({"correlation_id": "c" * 65}, "correlation_id", "at most 64"),
        ({"correlation_id": "a\x00b"}, "correlation_id", "NUL byte"),
        ({"priority": 40000}, "priority", "from 0 to 32767, got 40000"),
        ({"priority": -1}, "priority", "got -1"),
        ({"priority": True}, "priority", "got True"),
        ({"priority": "5"}, "priority", "got '5'"),
        ({"priority": 5.0}, "priority", "got 5.0"),
    ],
)
def test_a_bad_field_is_named(changes: dict[str, Any], field: str, fragment: str) -> None:
    error = refused(**changes)
    assert error.field == field
    assert fragment in str(error)


@pytest.mark.parametrize(
    ("payload", "field", "fragment"),
    [
        ("hello", "payload", "must be a JSON object (a dict), got str"),
        (["a", "list"], "payload", "must be a JSON object (a dict), got list"),
        ({"body": "a\x00b"}, "payload['body']", "NUL byte"),
        ({"a\x00": 1}, "payload", "has a key that contains a NUL byte"),
        ({"items": [1, {"x": "\ud800"}]}, "payload['items'][1]['x']", "lone surrogate"),
        ({1: "one"}, "payload", "has a key of type int (1); JSON keys are strings"),
        ({"at": object()}, "payload['at']", "object is not a JSON value"),
        ({"price": Decimal("1.10")}, "payload['price']", "Decimal is not a JSON value"),
        ({"tags": ("a", "b")}, "payload['tags']", "tuple is not a JSON value"),
        ({"tags": {"a", "b"}}, "payload['tags']", "set is not a JSON value"),
        ({"ratio": float("nan")}, "payload['ratio']", "nan is not a JSON number"),
        ({"n": [float("inf")]}, "payload['n'][0]", "inf is not a JSON number"),
        ({"big": 10**5000}, "payload", "cannot be encoded as JSON"),
    ],
)
def test_a_non_json_payload_is_refused_at_the_bad_value(payload: Any, field: str, fragment: str) -> None:
    error = refused(payload=payload)
    assert error.field == field
    assert fragment in str(error)


def test_depth_at_the_limit_passes_and_one_more_level_is_refused() -> None:
    assert check_payload(nested(32), max_bytes=1 << 20, max_depth=32)
    with pytest.raises(InvalidNotification, match=r"nests deeper than 32 levels \(MAX_PAYLOAD_DEPTH\)"):
        check_payload(nested(33), max_bytes=1 << 20, max_depth=32)


def test_a_100000_deep_payload_gets_a_clean_error_not_a_recursion_error() -> None:
    error = refused(payload=nested(100_000))
    assert error.field.startswith("payload['deep']")
    assert "nests deeper than 32 levels" in str(error)


def test_a_self_referencing_payload_is_refused_by_depth() -> None:
    payload: dict[str, Any] = {}
    payload["self"] = payload
    assert "nests deeper than" in str(refused(payload=payload))


def test_size_is_measured_as_compact_utf8_json_up_to_the_limit() -> None:
    limit = 1024
    # {"k":"…"} is 8 bytes of structure; "é" is two bytes in UTF-8.
    exact = {"k": "é" * ((limit - 8) // 2)}
    assert len(json.dumps(exact, ensure_ascii=False, separators=(",", ":")).encode()) == limit
    assert check_payload(exact, max_bytes=limit, max_depth=32) == exact
    over = {"k": "é" * ((limit - 8) // 2) + "a"}
    with pytest.raises(InvalidNotification, match=r"is 1025 bytes as JSON; at most 1024 .*MAX_PAYLOAD_BYTES"):
        check_payload(over, max_bytes=limit, max_depth=32)


def test_a_20_mb_payload_is_refused_quickly() -> None:
    payload = {"blob": "x" * (20 * 1024 * 1024)}
    started = time.perf_counter()
    error = refused(payload=payload)
    assert error.field == "payload"
    assert "at most 262144 are accepted (MAX_PAYLOAD_BYTES)" in str(error)
    assert time.perf_counter() - started < 0.5


def test_many_small_values_count_towards_the_size() -> None:
    with pytest.raises(InvalidNotification, match="MAX_PAYLOAD_BYTES"):
        check_payload({"n": list(range(100_000))}, max_bytes=256 * 1024, max_depth=32)
