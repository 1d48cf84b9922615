"""The lease rules held by the database, tried by raw SQL as a writer without the claim would.

A leased row's status changes only in the UPDATE that clears its lease; ``attempts`` goes down outside
an audited requeue only as the refund of an unstarted claim (one attempt, lease cleared, status kept).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from notifications_retry.delivery import (
    RETRY,
    SENT,
    ChannelClaim,
    ClaimRequest,
    Outcome,
    claim_due,
    finalize,
    release,
)
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.claims import claimed_in_app

pytestmark = pytest.mark.django_db

TABLE = NotificationEntity._meta.db_table
Status = NotificationEntity.Status
LEASE_RULE = "INV-LEASE: notification .* is leased .*: its status changes only in the UPDATE that clears"
ATTEMPTS_RULE = "attempts may only decrease through an audited requeue"

# What delivery.release runs: no pgtrigger.ignore, the triggers allow it as it is.
RELEASE_SQL = f"""
UPDATE {TABLE} t
SET attempts = t.attempts - 1, claim_token = NULL, claim_expires_at = NULL
FROM unnest(%s::uuid[], %s::uuid[]) AS v(id, token)
WHERE t.id = v.id AND t.claim_token = v.token
"""


def row_state(pk: uuid.UUID) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT row_to_json(t)::text FROM {TABLE} t WHERE id = %s", [pk])
        return cursor.fetchone()


def execute(sql: str, params: Any = ()) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.rowcount)


def assert_refused(pk: uuid.UUID, sql: str, params: Any, rule: str) -> None:
    before = row_state(pk)
    with pytest.raises(DatabaseError, match=rule):
        execute(sql, params)
    assert row_state(pk) == before


def leased(status: str = Status.PENDING, attempts: int = 1, **fields: Any) -> NotificationEntity:
    """A row as the claim leaves it: attempt counted, token and expiry set, status unchanged."""
    row = NotificationFactory(status=status, attempts=attempts - 1, next_attempt_at=timezone.now(), **fields)
    token = uuid.uuid4()
    execute(
        f"UPDATE {TABLE} SET attempts = attempts + 1, claim_token = %s, "
        "claim_expires_at = now() + interval '1 minute' WHERE id = %s",
        [token, row.pk],
    )
    row.refresh_from_db()
    assert row.claim_token == token
    return row


# --- a leased row's status changes only with its lease cleared -----------------------------------


@pytest.mark.parametrize(
    ("before", "assignment"),
    [
        ("pending", "status = 'sent'"),
        ("pending", "status = 'failed', next_attempt_at = now()"),
        ("failed", "status = 'sent', provider_message_id = 'monolith:1'"),
        ("pending", "status = 'sent', claim_token = NULL"),  # the expiry left behind
        ("pending", "status = 'sent', claim_expires_at = NULL"),  # the token left behind
        ("pending", "status = 'sent', claim_token = gen_random_uuid()"),  # a lease swapped, not cleared
    ],
)
def test_a_writer_without_the_claim_cannot_change_a_leased_rows_status(before: str, assignment: str) -> None:
    row = leased(status=before)
    assert_refused(row.pk, f"UPDATE {TABLE} SET {assignment} WHERE id = %s", [row.pk], LEASE_RULE)


def test_the_error_names_the_rule_the_row_and_the_claim() -> None:
    row = leased()
    with pytest.raises(DatabaseError) as info:
        execute(f"UPDATE {TABLE} SET status = 'sent' WHERE id = %s", [row.pk])
    message = str(info.value)
    assert "INV-LEASE" in message and str(row.pk) in message and str(row.claim_token) in message
    assert "claim_token and claim_expires_at set to NULL" in message


def test_the_monolith_marking_leased_rows_sent_in_bulk_changes_none_of_them() -> None:
    free = NotificationFactory(status=Status.FAILED, attempts=1, next_attempt_at=timezone.now())
    held = leased(status=Status.FAILED, attempts=2)
    with pytest.raises(DatabaseError, match="INV-LEASE"):
        execute(f"UPDATE {TABLE} SET status = 'sent' WHERE id = ANY(%s)", [[free.pk, held.pk]])
    free.refresh_from_db()
    held.refresh_from_db()
    assert (free.status, held.status) == (Status.FAILED, Status.FAILED)
    assert held.claim_token is not None


def test_a_status_change_that_clears_the_lease_passes() -> None:
    row = leased()
    execute(
        f"UPDATE {TABLE} SET status = 'sent', claim_token = NULL, claim_expires_at = NULL WHERE id = %s",
        [row.pk],
    )
    row.refresh_from_db()
    assert (row.status, row.claim_token, row.claim_expires_at) == (Status.SENT, None, None)


@pytest.mark.parametrize(
    "assignment",
    [
        "recipient = 'redacted'",
        "updated_at = now()",
        "claim_expires_at = now() + interval '5 minutes'",
        "status = status",  # not a change
    ],
)
def test_a_leased_row_keeps_its_other_columns_editable(assignment: str) -> None:
    row = leased()
    assert execute(f"UPDATE {TABLE} SET {assignment} WHERE id = %s", [row.pk]) == 1


def test_an_unleased_row_is_not_concerned() -> None:
    row = NotificationFactory(status=Status.FAILED, attempts=1, next_attempt_at=timezone.now())
    execute(f"UPDATE {TABLE} SET status = 'sent' WHERE id = %s", [row.pk])
    row.refresh_from_db()
    assert row.status == Status.SENT


def test_the_workers_claim_and_finalize_still_pass(clock: Any) -> None:
    now = clock.now()
    sent, retried = claimed_in_app(now, 2)
    report = finalize(
        [
            Outcome(sent, SENT, provider_message_id="in_app:1"),
            Outcome(retried, RETRY, error_kind="timeout", next_attempt_at=now + timedelta(minutes=1)),
        ],
        now,
    )
    assert len(report.applied) == 2 and not report.failed
    statuses = dict(NotificationEntity.objects.values_list("pk", "status"))
    assert (statuses[sent.id], statuses[retried.id]) == (Status.SENT, Status.FAILED)
    assert not NotificationEntity.objects.filter(claim_token__isnull=False).exists()


# --- the refund of an unstarted claim ----------------------------------------------------------------


def test_the_refund_of_an_unstarted_claim_passes_without_pgtrigger_ignore() -> None:
    row = leased(attempts=3)
    assert execute(RELEASE_SQL, [[row.pk], [row.claim_token]]) == 1
    row.refresh_from_db()
    assert (row.attempts, row.claim_token, row.claim_expires_at) == (2, None, None)


def test_release_gives_back_a_claimed_record(clock: Any) -> None:
    channel = ChannelFactory(key="in_app", max_attempts=5)
    now = clock.now()
    row = NotificationFactory(channel=channel, status=Status.FAILED, attempts=2, next_attempt_at=now)
    batch = claim_due(
        ClaimRequest(
            now, [ChannelClaim(channel.pk, 10, 60.0)], total=10, budgets={channel.pk: (5, channel.key)}
        )
    )
    assert release(batch.records) == 1
    row.refresh_from_db()
    assert (row.attempts, row.claim_token, row.status) == (2, None, Status.FAILED)


@pytest.mark.parametrize(
    "assignment",
    [
        # two attempts given back for one claim
        "attempts = attempts - 2, claim_token = NULL, claim_expires_at = NULL",
        # the lease kept
        "attempts = attempts - 1",
        "attempts = attempts - 1, claim_expires_at = NULL",
        "attempts = attempts - 1, claim_token = NULL",
        # a new lease instead of none
        "attempts = attempts - 1, claim_token = gen_random_uuid(), claim_expires_at = NULL",
        # the status changed with it
        "attempts = attempts - 1, claim_token = NULL, claim_expires_at = NULL, status = 'sent'",
    ],
)
def test_other_decreases_of_a_leased_row_stay_refused(assignment: str) -> None:
    row = leased(attempts=3)
    rule = f"{ATTEMPTS_RULE}|INV-LEASE"
    assert_refused(row.pk, f"UPDATE {TABLE} SET {assignment} WHERE id = %s", [row.pk], rule)


def test_a_refund_without_a_lease_is_refused() -> None:
    row = NotificationFactory(status=Status.FAILED, attempts=3, next_attempt_at=timezone.now())
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = attempts - 1, claim_token = NULL, claim_expires_at = NULL "
        "WHERE id = %s",
        [row.pk],
        ATTEMPTS_RULE,
    )


def test_a_second_refund_after_the_lease_is_gone_is_refused() -> None:
    row = leased(attempts=3)
    execute(RELEASE_SQL, [[row.pk], [row.claim_token]])
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = attempts - 1, claim_token = NULL WHERE id = %s",
        [row.pk],
        ATTEMPTS_RULE,
    )


def test_a_sent_row_gets_no_refund() -> None:
    row = NotificationFactory(status=Status.SENT, attempts=2)
    assert_refused(
        row.pk,
        f"UPDATE {TABLE} SET attempts = attempts - 1 WHERE id = %s",
        [row.pk],
        f"{ATTEMPTS_RULE}|is Sent, which is final",
    )


# --- the documented limit: the ignore door (docs/guarantees.md) -------------------------------------


def test_the_ignore_door_the_guarantees_document_is_real_and_constraints_ignore_it() -> None:
    pgids = {t.name: t.get_pgid(NotificationEntity) for t in NotificationEntity._meta.triggers}
    named = [pgids["nr_status_transitions"], pgids["nr_sent_is_final"]]
    text = (Path(__file__).resolve().parents[2] / "docs" / "guarantees.md").read_text()
    assert "{" + ",".join(named) + "}" in text  # the example in the docs works as written
    row = NotificationFactory(status=Status.SENT, attempts=2)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL pgtrigger.ignore = '{{{','.join(named)}}}'")
        cursor.execute(f"UPDATE {TABLE} SET status = 'pending' WHERE id = %s", [row.pk])
        with pytest.raises(DatabaseError, match="nr_notification_status_valid"), transaction.atomic():
            cursor.execute(f"UPDATE {TABLE} SET status = 'queued' WHERE id = %s", [row.pk])
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Status.PENDING, 2)
