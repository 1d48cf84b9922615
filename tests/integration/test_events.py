"""The event contract: every emitted event matches the schema, once per outcome, and only then."""

from __future__ import annotations

import json
import random
import uuid
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest
from django.db import IntegrityError, connection, transaction

import notifications_retry
from notifications_retry import api
from notifications_retry.delivery import events, finalize, triage
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
VALIDATOR = jsonschema.Draft202012Validator(events.schema(), format_checker=jsonschema.FormatChecker())


def make_worker(clock):
    return Worker(clock=clock, rng=random.Random(3))


def failed_due(clock, channel, **kwargs):
    kwargs.setdefault("attempts", 1)
    kwargs.setdefault("next_attempt_at", clock.now() - timedelta(seconds=5))
    return NotificationFactory(channel=channel, status=Status.FAILED, **kwargs)


def validated_events(key=None):
    """Every outbox event (of ``key``), as published, checked against the schema."""
    rows = Outbox.objects.order_by("id")
    if key is not None:
        rows = rows.filter(key=str(key))
    published = []
    for row in rows:
        event = events.envelope(row)
        # Round-trip through JSON: consumers see text, not Python objects.
        event = json.loads(json.dumps(event))
        VALIDATOR.validate(event)
        assert event["key"] == event["payload"]["notification_id"]
        published.append(event)
    return published


def assert_one_event_per_outcome():
    keys = list(Outbox.objects.values_list("key", "generation"))
    assert len(keys) == len(set(keys))


def test_schema_file_ships_in_the_package_and_is_a_valid_schema():
    path = Path(notifications_retry.__file__).parent / events.SCHEMA_RESOURCE
    assert json.loads(path.read_text()) == events.schema()
    jsonschema.Draft202012Validator.check_schema(events.schema())
    assert events.schema()["title"] == "pin.notifications.dispatched.v1"


def test_sent_events_from_failed_and_from_scheduled_pending_match_the_schema(clock):
    channel = ChannelFactory(key="in_app")
    retried = failed_due(clock, channel, tenant_id=None)
    scheduled = NotificationFactory(channel=channel, scheduled_at=clock.now() - timedelta(seconds=1))
    make_worker(clock).tick()
    published = validated_events()
    assert {e["key"] for e in published} == {str(retried.pk), str(scheduled.pk)}
    by_key = {e["key"]: e for e in published}
    assert by_key[str(retried.pk)]["payload"]["tenant_id"] is None
    assert by_key[str(scheduled.pk)]["payload"]["tenant_id"] == str(scheduled.tenant_id)
    for event in published:
        assert event["topic"] == "pin.notifications.dispatched.v1"
        assert event["contract_version"] == 1 and event["payload"]["contract_version"] == 1
        assert event["generation"] == 0
        assert event["payload"]["status"] == "Sent"
        assert event["payload"]["error"] is None and event["payload"]["error_kind"] is None
    assert_one_event_per_outcome()


@pytest.mark.parametrize(
    ("options", "attempts", "error_kind"),
    [
        ({"fail": "retriable"}, 2, "stub_retriable"),  # budget of 3 runs out
        ({"fail": "permanent"}, 1, "stub_permanent"),
    ],
)
def test_terminal_failed_events_match_the_schema(clock, options, attempts, error_kind):
    channel = ChannelFactory(key="email", provider_key="stub", options=options, max_attempts=3)
    record = failed_due(clock, channel, attempts=attempts)
    make_worker(clock).tick()
    (event,) = validated_events(record.pk)
    assert event["payload"]["status"] == "Failed"
    assert event["payload"]["error_kind"] == error_kind
    assert event["payload"]["error"]
    assert event["payload"]["attempts"] == attempts + 1


def test_expired_deadline_and_spent_budget_events_match_the_schema(clock):
    channel = ChannelFactory(key="in_app", max_attempts=3)
    expired = NotificationFactory(
        channel=channel,
        scheduled_at=clock.now() - timedelta(minutes=1),
        expires_at=clock.now() - timedelta(seconds=1),
    )
    spent = failed_due(clock, channel, attempts=3)
    make_worker(clock).tick()
    (expired_event,) = validated_events(expired.pk)
    (spent_event,) = validated_events(spent.pk)
    assert expired_event["payload"]["error_kind"] == "expired"
    assert expired_event["payload"]["attempts"] == 0
    assert expired_event["payload"]["provider_message_id"] is None
    assert spent_event["payload"]["error_kind"] == "attempts_exhausted"


def test_cancelled_event_matches_the_schema():
    record = NotificationFactory(channel=ChannelFactory(key="in_app"))
    api.cancel_notification(record.pk, actor="ops", reason="order cancelled")
    (event,) = validated_events(record.pk)
    assert event["payload"]["error_kind"] == "cancelled"


@pytest.mark.parametrize(
    ("reply", "message_id"), [(Reply(201, {"id": "prov-7"}), "prov-7"), (Reply(204), None)]
)
def test_webhook_sent_event_with_and_without_a_provider_id(clock, webhook_server, reply, message_id):
    webhook_server.responder = lambda request: reply
    channel = ChannelFactory(key="webhook", provider_key="webhook", options={"url": webhook_server.url})
    record = failed_due(clock, channel)
    make_worker(clock).tick()
    (event,) = validated_events(record.pk)
    assert event["payload"]["status"] == "Sent"
    assert event["payload"]["provider_message_id"] == message_id


def test_intermediate_failures_emit_nothing_and_the_final_outcome_exactly_once(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=4)
    record = NotificationFactory(channel=channel, scheduled_at=clock.now() - timedelta(seconds=1))
    worker = make_worker(clock)
    for attempt in range(1, 5):
        worker.tick()
        record.refresh_from_db()
        assert record.attempts == attempt
        assert Outbox.objects.filter(key=str(record.pk)).count() == (1 if attempt == 4 else 0)
        clock.set(record.next_attempt_at or clock.now())
        clock.advance(1)
    # Later ticks find nothing to do: the dead letter is not due, no second event appears.
    worker.tick()
    clock.advance(7200)
    worker.tick()
    (event,) = validated_events(record.pk)
    assert event["payload"]["status"] == "Failed" and event["payload"]["attempts"] == 4


def test_requeued_dead_letter_emits_a_new_event_with_the_next_generation(clock):
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"}, max_attempts=3)
    record = failed_due(clock, channel)
    worker = make_worker(clock)
    worker.tick()
    triage.requeue([record.pk], actor="alice", reason="template fixed", now=clock.now())
    channel.provider_key, channel.options = "in_app", {}
    channel.save()
    clock.advance(1)
    worker.tick()
    first, second = validated_events(record.pk)
    assert (first["generation"], first["payload"]["status"]) == (0, "Failed")
    assert (second["generation"], second["payload"]["status"]) == (1, "Sent")
    assert second["payload"]["attempts"] == 1
    assert first["event_id"] != second["event_id"]
    assert_one_event_per_outcome()


def test_a_second_event_for_the_same_outcome_is_refused_by_the_database(clock):
    record = failed_due(clock, ChannelFactory(key="in_app"))
    make_worker(clock).tick()
    (event,) = Outbox.objects.all()
    # Under its own (derived) id, the unique event_id; under any other, the insert trigger.
    for event_id, refusal in [(event.event_id, "event_id"), (uuid.uuid4(), "must be nr_outbox_event_id")]:
        with (
            pytest.raises(IntegrityError, match=refusal),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(
                "INSERT INTO notifications_retry_outbox (event_id, topic, key, contract_version, generation, "
                "payload, created_at) VALUES (%s, %s, %s, 1, 0, %s::jsonb, now())",
                [event_id, event.topic, event.key, json.dumps(event.payload)],
            )
    assert list(Outbox.objects.values_list("event_id", flat=True)) == [event.event_id]
    record.refresh_from_db()
    assert record.status == Status.SENT


def test_a_late_finalize_of_the_same_outcome_writes_no_second_event(clock):
    from notifications_retry.delivery import SENT, ChannelClaim, ClaimRequest, Outcome, claim_due

    channel = ChannelFactory(key="in_app")
    record = failed_due(clock, channel)
    batch = claim_due(
        ClaimRequest(
            clock.now(), [ChannelClaim(channel.pk, 10, 60)], total=10, budgets={channel.pk: (3, "in_app")}
        )
    )
    (claimed,) = batch.records
    outcome = Outcome(claimed, SENT, provider_message_id="p-1")
    assert len(finalize([outcome], clock.now()).applied) == 1
    report = finalize([outcome], clock.now())  # a retried finalize, e.g. after a lost reply
    assert report.stale == [outcome] and not report.applied
    assert Outbox.objects.filter(key=str(record.pk)).count() == 1


@pytest.mark.parametrize(
    ("status", "fields", "payload_status"),
    [
        (Status.FAILED, {"attempts": 1}, "Failed"),  # retrying, not terminal
        (Status.PENDING, {}, "Sent"),
        (Status.SENT, {}, "Failed"),  # status of the event disagrees with the row
    ],
)
def test_an_event_that_matches_no_final_outcome_is_refused(status, fields, payload_status):
    record = NotificationFactory(channel=ChannelFactory(key="in_app"), status=status, **fields)
    with pytest.raises(Exception, match="only on Sent and terminal Failed"), transaction.atomic():
        events.dispatched_event(
            generation=0,
            created_at=record.created_at,
            notification_id=record.pk,
            tenant_id=None,
            channel="in_app",
            status=payload_status,
            attempts=1,
            provider_message_id=None,
            error="x" if payload_status == "Failed" else None,
            error_kind="x" if payload_status == "Failed" else None,
        ).save(force_insert=True)
    assert Outbox.objects.count() == 0


def test_an_event_of_another_generation_or_inserted_published_is_refused():
    record = NotificationFactory(channel=ChannelFactory(key="in_app"), status=Status.SENT, attempts=1)

    def event(generation):
        return events.dispatched_event(
            generation=generation,
            created_at=record.created_at,
            notification_id=record.pk,
            tenant_id=None,
            channel="in_app",
            status="Sent",
            attempts=1,
            provider_message_id="p",
            error=None,
            error_kind=None,
        )

    with pytest.raises(Exception, match="only on Sent and terminal Failed"), transaction.atomic():
        event(1).save(force_insert=True)
    published = event(0)
    published.published_at = record.created_at
    with pytest.raises(Exception, match="must be inserted unpublished"), transaction.atomic():
        published.save(force_insert=True)
    assert Outbox.objects.count() == 0
    event(0).save(force_insert=True)
    assert Outbox.objects.count() == 1


def test_payload_refuses_a_status_other_than_sent_or_failed():
    with pytest.raises(ValueError, match="Sent or Failed"):
        events.dispatched_payload(
            notification_id=uuid.uuid4(),
            tenant_id=None,
            channel="in_app",
            status="Pending",
            attempts=0,
            provider_message_id=None,
            error=None,
            error_kind=None,
            occurred_at=NotificationEntity().created_at,
        )


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e["payload"].update(status="Pending"),
        lambda e: e["payload"].update(error_kind=None),  # a Failed event must say why
        lambda e: e["payload"].update(extra=1),
        lambda e: e.update(contract_version=2),
        lambda e: e.update(key="not-a-uuid"),
        lambda e: e["payload"].update(occurred_at="yesterday"),
        lambda e: e.pop("event_id"),
    ],
)
def test_the_schema_is_strict_enough_to_catch_drift(change):
    record = NotificationFactory(channel=ChannelFactory(key="in_app"))
    api.cancel_notification(record.pk, actor="ops")
    (event,) = validated_events(record.pk)
    change(event)
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(event)
