"""The masking fast path: texts it lets through untouched are texts the patterns would not change."""

from __future__ import annotations

import random
import string
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import notifications_retry.observability.logging as nr_logging


def _samples(rng: random.Random) -> list[str]:
    texts: list[str] = []
    for _ in range(400):
        texts.append(str(uuid.UUID(int=rng.getrandbits(128))))
        # All digits: the shape a phone number pattern could mistake for one.
        texts.append(str(uuid.UUID(hex="".join(rng.choice(string.digits) for _ in range(32)))))
        texts.append(uuid.UUID(int=rng.getrandbits(128)).hex)
        texts.append("".join(rng.choice(string.digits) for _ in range(32)))
        when = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(10**9))
        texts.append(when.isoformat())
        texts.append(when.replace(microsecond=rng.randrange(10**6)).isoformat())
        texts.append(when.replace(tzinfo=None).isoformat() + "Z")
        texts.append(when.replace(tzinfo=None).isoformat(timespec="seconds"))
        texts.append("".join(rng.choice(string.ascii_letters + "_.-") for _ in range(rng.randrange(1, 80))))
    return texts


@pytest.mark.parametrize("opaque", [True, False])
def test_plain_texts_are_what_the_patterns_leave_unchanged(opaque: bool) -> None:
    for text in _samples(random.Random(15)):
        assert nr_logging._PLAIN.fullmatch(text), text
        assert nr_logging._apply_patterns(text, opaque) == text, text
        assert nr_logging.mask_text(text, opaque) == text


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("ana@example.com", "ana@example.com"),
        ("call +44 20 7946 0958", "7946 0958"),
        ("2026-12-03T10:00:00Z ana@example.com", "ana@example.com"),
        ("https://user:pw@example.com/x", "user:pw"),
        ("Bearer abcdefghijklmnop", "abcdefghijklmnop"),
        ("a7Hk29Qz0pLm3Xv8Rt5Nw1Yb", "a7Hk29Qz0pLm3Xv8Rt5Nw1Yb"),
    ],
)
def test_texts_off_the_fast_path_are_still_masked(text: str, hidden: str) -> None:
    assert not nr_logging._PLAIN.fullmatch(text)
    assert hidden not in nr_logging.mask_text(text)


def test_event_values_are_masked_by_key_and_kept_by_type() -> None:
    nid = uuid.uuid4()
    event = nr_logging.mask_event_dict(
        None,
        "info",
        {
            "event": "item-sent",
            "notification_id": str(nid),
            "correlation_id": "req-a7Hk29Qz0pLm3Xv8Rt5Nw1Yb",
            "attempt": 2,
            "duration_ms": 20.5,
            "tenant_id": None,
            "recipient": "ana@example.com",
            "note": "for ana@example.com",
        },
    )
    assert event["notification_id"] == str(nid)
    # An identifier stays greppable even when it looks opaque; a free-text field does not.
    assert event["correlation_id"] == "req-a7Hk29Qz0pLm3Xv8Rt5Nw1Yb"
    assert (event["attempt"], event["duration_ms"], event["tenant_id"]) == (2, 20.5, None)
    assert "ana@example.com" not in event["recipient"]
    assert "ana@example.com" not in event["note"]


def test_webhook_signing_secrets_are_masked_in_logged_options() -> None:
    secret = "whsec_" + "A" * 20 + "b3" * 12
    logged = nr_logging.mask_value(
        {"url": "https://hooks.example.com/x", "secret": secret, "secrets": [secret]}
    )
    assert secret not in repr(logged)
    assert logged["secrets"] == nr_logging.MASK and logged["secret"] == nr_logging.MASK


# Texts built from the characters the patterns look for, so that near-misses are common, and from
# pieces of what each pattern matches.
_PATTERN_ALPHABET = string.ascii_letters + string.digits + "@=.:-_+()/?&;% \t\n'\"<>"
_PATTERN_CORES = [
    nr_logging._EMAIL.pattern,
    r"\+?\(?\d[\d ().-]{6,}\d",
    nr_logging._BEARER.pattern,
    nr_logging._QUERY_SECRET.pattern,
    nr_logging._QUERY_RECIPIENT.pattern,
    nr_logging._URL_USERINFO.pattern,
    r"[A-Za-z0-9_:-]{20,}",
]
_PIECES = [
    "Bearer",
    "basic",
    "TOKEN",
    " ",
    "\t",
    "abcdef12",
    "ana",
    "@",
    "example.com",
    "=",
    "?",
    "&",
    "to",
    "sig",
    "https://",
    "u:p",
    "/",
    "+44",
    "(20)",
    "7946",
    "0958",
    "-",
    ".",
    "2026-12-03",
    "req",
    "_",
    "a7Hk29Qz0pLm3Xv8Rt5N",
    "9f8e7d6c",
    ":",
]


@settings(max_examples=2000, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from(_PATTERN_ALPHABET), max_size=60)
    | st.text(max_size=40)
    | st.from_regex(r"(req|msg|id)[-_][0-9a-zA-Z\-]{1,40}", fullmatch=True)
    | st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)
    # Texts holding a match of one pattern (its lookarounds aside), between arbitrary characters.
    | st.sampled_from(_PATTERN_CORES).flatmap(st.from_regex),
    opaque=st.booleans(),
)
def test_the_gate_lets_through_only_texts_no_pattern_changes(text: str, opaque: bool) -> None:
    """A text the gate waves through comes out of the seven patterns unchanged."""
    if not nr_logging._may_change(text, opaque):
        assert nr_logging._apply_patterns(text, opaque) == text


def test_a_unique_identifier_skips_the_patterns_but_a_secret_inside_one_does_not() -> None:
    assert nr_logging.mask_text("req-9f8e7d6c-0001", opaque=False) == "req-9f8e7d6c-0001"
    assert "ana@example.com" not in nr_logging.mask_text("req-ana@example.com", opaque=False)
    assert "7946 0958" not in nr_logging.mask_text("req-+44 20 7946 0958", opaque=False)


def _masked_one_value_at_a_time(event: dict[object, object]) -> dict[object, object]:
    """mask_event_dict's rule, applied the long way: free text by mask_text, the rest by mask_value."""
    masked = {}
    for key, value in event.items():
        if key in nr_logging._UNTOUCHED_KEYS:
            masked[key] = value
        elif key in ("event", "exception", "stack", "stack_info") and isinstance(value, str):
            masked[key] = nr_logging.mask_text(value)
        else:
            masked[key] = nr_logging.mask_value(value, key)
    return masked


class _Text(str):
    """A str subclass (a lazy translation, say): off the fast path's exact-type checks."""


_EVENT_KEYS = st.sampled_from(
    [
        "event", "exception", "stack", "stack_info", "timestamp", "level", "logger",
        "notification_id", "correlation_id", "tenant_id", "job_run_id", "channel", "lane", "outcome",
        "attempt", "duration_ms", "note", "error", "recipient", "to", "user_email", "api_key", "token",
        "x-signature", "payload", "body", "headers", "Authorization", "Notification-ID",
    ]
)  # fmt: skip
_EVENT_VALUES = st.one_of(
    st.none(),
    st.text(alphabet=st.sampled_from(_PATTERN_ALPHABET), max_size=40),
    st.lists(st.sampled_from(_PIECES), max_size=6).map("".join),
    st.uuids().map(str),
    st.uuids(),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.datetimes(),
    st.just(""),
    st.lists(st.sampled_from(_PIECES), max_size=4).map("".join).map(_Text),
    st.dictionaries(st.sampled_from(["to", "text", "id", "token"]), st.sampled_from(_PIECES), max_size=3),
    st.lists(st.sampled_from(_PIECES), max_size=3),
)


@settings(max_examples=1500, deadline=None)
@given(
    event=st.dictionaries(_EVENT_KEYS | st.integers(0, 3), _EVENT_VALUES, max_size=12),
)
def test_an_event_is_masked_as_each_value_under_its_key_would_be(event: dict[object, object]) -> None:
    """The per-event fast path gives what mask_value (and mask_text for free text) give value by value."""
    expected = _masked_one_value_at_a_time(dict(event))
    assert nr_logging.mask_event_dict(None, "info", dict(event)) == expected


def test_a_text_repeated_as_the_same_object_is_masked_every_time_it_needs_it() -> None:
    """mask_event_dict passes a value it has just left unchanged under the same key without a look;
    a value that needs masking is masked each time, however often it comes back."""
    plain, address = "order shipped", "reach ana@example.com now"
    for _ in range(3):
        assert nr_logging.mask_event_dict(None, "info", {"note": plain})["note"] == plain
        masked = nr_logging.mask_event_dict(None, "info", {"note": address})["note"]
        assert "ana@example.com" not in masked
        assert nr_logging.mask_event_dict(None, "info", {"recipient": plain})["recipient"] != plain
