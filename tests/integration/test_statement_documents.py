"""JSON between the worker and the database. Rows travel to it as one JSON document
(delivery.session.json_document): written by orjson, and what orjson refuses is written as before and
judged by the database, one row alone. Payloads come back from a claim as they were stored."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from notifications_retry.delivery import RETRY, SENT, Outcome, finalize
from notifications_retry.delivery.session import json_document
from notifications_retry.models import NotificationEntity
from tests.support.claims import claimed_in_app


@pytest.mark.parametrize(
    "value",
    [
        [{"id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "attempts": 3, "duration_ms": 20.5, "token": None}],
        {"café": "naïve ✓", "nested": {"list": [1, 2.25, True, None, ""]}},
        ["ana@example.com", 'quote " and backslash \\ and newline \n'],
    ],
)
def test_a_document_reads_back_as_the_value(value: Any) -> None:
    assert json.loads(json_document(value)) == value


@pytest.mark.parametrize("value", [{"error": "caf\udce9"}, {"attempts": 2**70}])
def test_what_orjson_refuses_is_written_as_the_standard_library_writes_it(value: Any) -> None:
    assert json_document(value) == json.dumps(value)


@pytest.mark.django_db(transaction=True)
def test_an_error_text_with_a_lone_surrogate_fails_its_row_alone(clock: Any) -> None:
    """The database refuses the surrogate's escape: the batch is redone row by row, the others apply."""
    now = clock.now()
    first, bad, last = claimed_in_app(now, 3)
    later = now + timedelta(minutes=1)
    report = finalize(
        [
            Outcome(first, SENT, provider_message_id="in_app:1"),
            Outcome(bad, RETRY, error_kind="http_5xx", error="HTTP 500: caf\udce9", next_attempt_at=later),
            Outcome(last, RETRY, error_kind="http_5xx", error="HTTP 500: café", next_attempt_at=later),
        ],
        now,
    )
    assert [o.record.id for o in report.failed] == [bad.id]
    assert {o.record.id for o in report.applied} == {first.id, last.id}
    refused = NotificationEntity.objects.get(pk=bad.id)
    assert refused.claim_token is not None  # left leased: its lease runs out and it is claimed again
    assert NotificationEntity.objects.get(pk=last.id).last_error == "HTTP 500: café"


@pytest.mark.django_db(transaction=True)
def test_a_claimed_payload_keeps_an_integer_past_64_bits(clock: Any) -> None:
    """A 30-digit order number reaches the provider as stored (orjson would read it as a float)."""
    order = 123456789012345678901234567890
    (record,) = claimed_in_app(clock.now(), 1, payload={"order": order, "total": 1.5})
    assert record.payload == {"order": order, "total": 1.5}
    assert type(record.payload["order"]) is int
