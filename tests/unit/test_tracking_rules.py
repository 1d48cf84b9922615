"""Which ESP events suppress and which set a delivery state (no database: the pure reading of an event)."""

from __future__ import annotations

import uuid

import pytest
from anymail.signals import AnymailTrackingEvent

from notifications_retry.tracking import permanent_bounce, read_event, smtp_class

NID = uuid.uuid4()


def event(event_type, **fields):
    fields.setdefault("metadata", {"notification_id": str(NID)})
    return AnymailTrackingEvent(
        event_type=event_type, recipient="ann@example.com", message_id="m-1", **fields
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("smtp;550 5.1.1 user unknown", "5"),
        ("550-5.1.1 The email account does not exist", "5"),
        ("5.2.1 mailbox disabled", "5"),
        ("451 4.3.0 try again later", "4"),
        ("smtp; 452 4.2.2 mailbox full", "4"),
        ("Delivered 2026-03-01 at 10:00", None),
        ("", None),
        (None, None),
    ],
)
def test_smtp_class_reads_the_first_reply_code(text, expected):
    assert smtp_class(text) == expected


@pytest.mark.parametrize(
    ("esp", "esp_event", "mta_response", "permanent"),
    [
        ("Postmark", {"Type": "HardBounce"}, None, True),
        ("Postmark", {"Type": "SoftBounce"}, "smtp;550 5.1.1", False),  # Postmark's own word wins
        ("Mailgun", {"event-data": {"severity": "permanent"}}, None, True),
        ("Mailgun", {"event-data": {"severity": "temporary"}}, "550 5.1.1", False),
        ("Amazon SES", {"bounce": {"bounceType": "Permanent"}}, None, True),
        ("Amazon SES", {"bounce": {"bounceType": "Transient"}}, "smtp; 550 5.1.1", False),
        ("SendGrid", {"type": "bounce"}, None, True),
        ("SendGrid", {"type": "blocked"}, "550 5.7.1 blocked", False),
        ("SparkPost", {}, "550 5.1.1 unknown user", True),
        ("SparkPost", {}, "452 4.2.2 over quota", False),
        ("SparkPost", {}, None, False),  # nothing says it is permanent: never suppress on a guess
    ],
)
def test_a_bounce_is_permanent_only_when_the_esp_says_so(esp, esp_event, mta_response, permanent):
    assert permanent_bounce(esp, esp_event, mta_response, None) is permanent


@pytest.mark.parametrize(
    ("evt", "state", "suppress"),
    [
        (event("delivered"), "delivered", None),
        (event("opened"), "opened", None),
        (event("clicked"), None, None),
        (event("deferred", mta_response="451 4.3.0 later"), None, None),
        (event("bounced", esp_event={"Type": "HardBounce"}), "bounced", "hard_bounce"),
        (event("bounced", esp_event={"Type": "SoftBounce"}), None, None),
        (event("complained"), "complained", "complaint"),
        (event("unsubscribed"), None, "unsubscribed"),
        (event("rejected", reject_reason="invalid"), None, "invalid_recipient"),
        (event("rejected", reject_reason="bounced"), None, "hard_bounce"),
        (event("rejected", reject_reason="spam"), None, "complaint"),
        (event("rejected", reject_reason="blocked"), None, None),
        (event("rejected", reject_reason="timed_out"), None, None),
        (event("rejected", reject_reason="other"), None, None),
        (event("rejected"), None, None),
        (event("failed"), None, None),
    ],
)
def test_what_each_event_calls_for(evt, state, suppress):
    report = read_event(evt, "Postmark")
    assert (report.state, report.suppress) == (state, suppress)
    assert (report.notification_id, report.message_id, report.recipient) == (NID, "m-1", "ann@example.com")


def test_metadata_that_names_no_notification_leaves_the_report_unmatched():
    for metadata in ({}, {"notification_id": "not-a-uuid"}, None, {"notification_id": ""}):
        assert read_event(event("complained", metadata=metadata), "Postmark").notification_id is None
