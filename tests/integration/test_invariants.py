"""Invariants held by the database: each forbidden change is tried by raw SQL and must fail.

Every case checks three things: the statement fails, the error names the rule, and neither the
notification row nor the outbox changed.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from notifications_retry.delivery import events
from notifications_retry.models import DeadLetterAction, NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

TABLE = NotificationEntity._meta.db_table
OUTBOX = Outbox._meta.db_table
Status = NotificationEntity.Status


def snapshot(pk):
    """The row and the whole outbox, as the database holds them."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(t)::text FROM {TABLE} t WHERE id = %s", [pk])
        row = cursor.fetchone()
        cursor.execute(f"SELECT coalesce(json_agg(o ORDER BY o.id)::text, '[]') FROM {OUTBOX} o")
        outbox = cursor.fetchone()
    return row, outbox


def execute(sql, params=()):
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def assert_refused(pk, sql, params, rule):
    before = snapshot(pk)
    with pytest.raises(DatabaseError, match=rule):
        execute(sql, params)
    assert snapshot(pk) == before


def with_event(row):
    events.dispatched_event(
        generation=row.requeue_count,
        created_at=row.updated_at,
        notification_id=row.pk,
        tenant_id=row.tenant_id,
        channel=row.channel.key,
        status="Sent" if row.status == Status.SENT else "Failed",
        attempts=row.attempts,
        provider_message_id=row.provider_message_id,
        error=row.last_error or None,
        error_kind=row.error_kind or None,
    ).save(force_insert=True)
    return row


def sent_row():
    return with_event(
        NotificationFactory(
            channel=ChannelFactory(key="in_app"),
            status=Status.SENT,
            attempts=2,
            provider_message_id="in_app:1",
        )
    )


def dead_letter_row(**fields):
    return with_event(
        NotificationFactory(
            channel=ChannelFactory(key="email"),
            status=Status.FAILED,
            attempts=3,
            dead_lettered_at=timezone.now(),
            error_kind="http_4xx",
            last_error="HTTP 410",
            dead_letter_reason="http_4xx: HTTP 410",
            **fields,
        )
    )


# --- INV-NTF-5: status transitions -------------------------------------------------------------------


@pytest.mark.parametrize("target", ["pending", "failed"])
def test_sent_is_final_status_cannot_change(target):
    row = sent_row()
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET status = %s WHERE id = %s",
        [target, row.pk],
        f"INV-NTF-5 forbids the status transition sent -> {target}",
    )


def test_failed_cannot_go_back_to_pending():
    row = NotificationFactory(status=Status.FAILED, attempts=1, next_attempt_at=timezone.now())
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET status = 'pending' WHERE id = %s",
        [row.pk],
        "INV-NTF-5 forbids the status transition failed -> pending",
    )


def test_a_status_outside_the_three_is_refused():
    row = NotificationFactory()
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET status = 'queued' WHERE id = %s",
        [row.pk],
        "nr_notification_status_valid|INV-NTF-5",
    )


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("attempts", 3),
        ("provider_message_id", "other"),
        ("next_attempt_at", timezone.now()),
        ("claim_token", uuid.uuid4()),
        ("error_kind", "rewritten"),
    ],
)
def test_a_sent_rows_delivery_state_cannot_change(column, value):
    row = sent_row()
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET {column} = %s WHERE id = %s",
        [value, row.pk],
        "INV-NTF-5: notification .* is Sent, which is final",
    )


@pytest.mark.parametrize(
    ("before", "after"),
    [("failed", "sent"), ("pending", "sent"), ("pending", "failed"), ("failed", "failed")],
)
def test_allowed_transitions_pass(before, after):
    row = NotificationFactory(status=before, attempts=1, next_attempt_at=timezone.now())
    execute(f"UPDATE {TABLE} SET status = %s WHERE id = %s", [after, row.pk])
    row.refresh_from_db()
    assert row.status == after


def test_a_sent_row_may_be_redacted_and_touched_without_changing_its_outcome():
    row = sent_row()
    execute(
        f"UPDATE {TABLE} SET recipient = 'redacted', payload = '{{}}', updated_at = now() WHERE id = %s",
        [row.pk],
    )
    row.refresh_from_db()
    assert (row.status, row.recipient, row.attempts) == (Status.SENT, "redacted", 2)


# --- attempts and requeue ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [Status.FAILED, Status.PENDING])
def test_attempts_never_decrease_outside_a_requeue(status):
    row = NotificationFactory(status=status, attempts=2, next_attempt_at=timezone.now())
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = 1 WHERE id = %s",
        [row.pk],
        "attempts may only decrease through an audited requeue",
    )


def test_requeue_count_never_decreases():
    row = dead_letter_row(requeue_count=0)
    DeadLetterAction.objects.create(notification=row, action="requeue", actor="a")
    execute(
        f"UPDATE {TABLE} SET requeue_count = 1, attempts = 0, dead_lettered_at = NULL WHERE id = %s", [row.pk]
    )
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET requeue_count = 0 WHERE id = %s",
        [row.pk],
        "attempts may only decrease through an audited requeue",
    )


def test_a_requeue_without_its_audit_row_is_refused():
    row = dead_letter_row()
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = 0, requeue_count = requeue_count + 1, dead_lettered_at = NULL, "
        "next_attempt_at = now() WHERE id = %s",
        [row.pk],
        "requeue must be audited: no DeadLetterAction row for requeue 1",
    )


def test_a_requeue_skipping_a_count_is_refused():
    row = dead_letter_row()
    DeadLetterAction.objects.create(notification=row, action="requeue", actor="a")
    DeadLetterAction.objects.create(notification=row, action="requeue", actor="a")
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = 0, requeue_count = 2 WHERE id = %s",
        [row.pk],
        "requeue must be audited: requeue_count moves by one",
    )


def test_only_a_dead_letter_can_be_requeued():
    row = NotificationFactory(status=Status.FAILED, attempts=2, next_attempt_at=timezone.now())
    DeadLetterAction.objects.create(notification=row, action="requeue", actor="a")
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = 0, requeue_count = 1 WHERE id = %s",
        [row.pk],
        "requeue must be audited: notification .* is not a dead letter",
    )


def test_an_audited_requeue_may_reset_attempts():
    row = dead_letter_row()
    DeadLetterAction.objects.create(notification=row, action="requeue", actor="a")
    execute(
        f"UPDATE {TABLE} SET attempts = 0, requeue_count = 1, dead_lettered_at = NULL WHERE id = %s", [row.pk]
    )
    row.refresh_from_db()
    assert (row.attempts, row.requeue_count, row.dead_lettered_at) == (0, 1, None)


# --- dead letters -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment",
    [
        "dead_lettered_at = NULL",
        "dead_lettered_at = NULL, status = 'sent'",
        "dead_lettered_at = dead_lettered_at - interval '40 days'",
    ],
)
def test_a_dead_letter_leaves_its_state_only_through_a_requeue(assignment):
    row = dead_letter_row()
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET {assignment} WHERE id = %s",
        [row.pk],
        "is a dead letter: it leaves the dead-letter state only through an audited requeue",
    )


def test_a_dead_letter_cannot_be_sent_without_leaving_the_dead_letters():
    row = dead_letter_row()
    assert_refused(
        row.pk, f"UPDATE {TABLE} SET status = 'sent' WHERE id = %s", [row.pk], "nr_dead_letter_is_failed"
    )


def test_a_resolution_needs_a_dead_letter():
    row = NotificationFactory(status=Status.FAILED, attempts=1, next_attempt_at=timezone.now())
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET resolution = 'discarded' WHERE id = %s",
        [row.pk],
        "nr_resolution_needs_dead_letter",
    )


# --- the outbox ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "assignment",
    [
        "payload = jsonb_set(payload, '{status}', '\"Failed\"')",
        "key = %(other)s",
        "generation = generation + 1",
        "created_at = created_at - interval '1 day'",
        "event_id = %(other)s::uuid",
        "contract_version = 2",
        "topic = 'other.topic'",
    ],
)
def test_an_outbox_event_is_immutable(assignment):
    row = sent_row()
    assert_refused(
        row.pk,
        f"UPDATE {OUTBOX} SET {assignment} WHERE key = %(key)s",
        {"key": str(row.pk), "other": str(uuid.uuid4())},
        "outbox event .* is immutable: only marking it published is allowed",
    )


def test_marking_published_is_allowed_once_and_never_undone():
    row = sent_row()
    execute(f"UPDATE {OUTBOX} SET published_at = now() WHERE key = %s", [str(row.pk)])
    assert Outbox.objects.get(key=str(row.pk)).published_at is not None
    for assignment in (
        "published_at = NULL",
        "published_at = now() + interval '1 hour'",
        "payload = '{}'::jsonb",
    ):
        assert_refused(
            row.pk,
            f"UPDATE {OUTBOX} SET {assignment} WHERE key = %s",
            [str(row.pk)],
            "outbox event .* is immutable",
        )


def test_an_unpublished_event_cannot_be_deleted():
    row = sent_row()
    assert_refused(
        row.pk,
        f"DELETE FROM {OUTBOX} WHERE key = %s",
        [str(row.pk)],
        "outbox event .* is not published yet and cannot be deleted",
    )


def test_a_published_event_may_be_deleted():
    row = sent_row()
    execute(f"UPDATE {OUTBOX} SET published_at = now() WHERE key = %s", [str(row.pk)])
    execute(f"DELETE FROM {OUTBOX} WHERE key = %s", [str(row.pk)])
    assert not Outbox.objects.exists()


def test_an_event_for_an_outcome_that_did_not_happen_is_refused():
    row = NotificationFactory(status=Status.FAILED, attempts=1, next_attempt_at=timezone.now() + timedelta(1))
    payload = events.dispatched_payload(
        notification_id=row.pk,
        tenant_id=None,
        channel="x",
        status="Failed",
        attempts=1,
        provider_message_id=None,
        error="e",
        error_kind="k",
        occurred_at=timezone.now(),
    )
    assert_refused(
        row.pk,
        f"INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at) "
        "VALUES (%s, 'pin.notifications.dispatched.v1', %s, 1, 0, %s::jsonb, now())",
        [uuid.uuid4(), str(row.pk), json.dumps(payload)],
        "dispatched events only on Sent and terminal Failed",
    )


def test_an_event_whose_key_is_not_its_notification_is_refused():
    row = sent_row()
    payload = dict(Outbox.objects.get().payload)
    assert_refused(
        row.pk,
        f"INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at) "
        "VALUES (%s, 'pin.notifications.dispatched.v1', %s, 1, 1, %s::jsonb, now())",
        [uuid.uuid4(), str(uuid.uuid4()), json.dumps(payload)],
        "must be the NotificationId of its payload",
    )
