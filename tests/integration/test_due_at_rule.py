"""``due_at`` always follows its rule (triggers.DUE_AT_RULE): the worker's claim and finalize write it
themselves, and the trigger corrects any other write that leaves it off the rule."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from notifications_retry.database.triggers import DUE_AT_RULE
from notifications_retry.delivery import (
    RETRY,
    SENT,
    TERMINAL,
    ChannelClaim,
    ClaimRequest,
    Outcome,
    claim_due,
    finalize,
)
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, due_notifications

TABLE = NotificationEntity._meta.db_table


def due_at(pk) -> object:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT due_at FROM {TABLE} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def rule(pk) -> object:
    """The rule, computed from the row as it is now."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {DUE_AT_RULE.replace('NEW.', '')} FROM {TABLE} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def lease_expiry(pk) -> object:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT claim_expires_at FROM {TABLE} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


@pytest.mark.django_db
def test_a_raw_write_that_leaves_due_at_off_the_rule_is_corrected(clock):
    (row,) = due_notifications(clock, ChannelFactory(key="in_app"), 1)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET due_at = now() + interval '9 days' WHERE id = %s", [row.pk])
        assert due_at(row.pk) == rule(row.pk) == clock.now() - timedelta(seconds=1)
        later = clock.now() + timedelta(hours=1)
        cursor.execute(f"UPDATE {TABLE} SET next_attempt_at = %s WHERE id = %s", [later, row.pk])
        assert due_at(row.pk) == later, "a write that moves the rule's inputs moves due_at"
        cursor.execute(
            f"UPDATE {TABLE} SET status = 'sent', provider_message_id = 'm' WHERE id = %s", [row.pk]
        )
        assert due_at(row.pk) is None


def trigger_off() -> None:
    """The due-time trigger disabled inside the test's transaction (rolled back with it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE %s",
            [TABLE, "pgtrigger_nr_maintain_due_at%"],
        )
        (name,) = cursor.fetchone()
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no deferred checks pending: ALTER may run
        cursor.execute(f"ALTER TABLE {TABLE} DISABLE TRIGGER {name}")


@pytest.mark.django_db
@pytest.mark.parametrize("result", [SENT, RETRY, TERMINAL])
def test_the_claim_and_the_finalize_write_the_rule_themselves(clock, result):
    channel = ChannelFactory(key="in_app", timeout_seconds=5)
    (row,) = due_notifications(clock, channel, 1)
    trigger_off()
    batch = claim_due(
        ClaimRequest(
            clock.now(),
            [ChannelClaim(channel.pk, 10, 40.0)],
            total=10,
            budgets={channel.pk: (channel.max_attempts, channel.key)},
        )
    )
    (record,) = batch.records
    assert due_at(row.pk) is None and rule(row.pk) is None, "leased: in no due index"
    assert lease_expiry(row.pk) == clock.now() + timedelta(seconds=40)
    later = clock.now() + timedelta(minutes=5)
    outcome = Outcome(
        record,
        result,
        provider_message_id="m" if result == SENT else None,
        error="" if result == SENT else "refused",
        error_kind="" if result == SENT else "http_4xx",
        next_attempt_at=later if result == RETRY else None,
    )
    report = finalize([outcome], clock.now())
    assert [o.record.id for o in report.applied] == [row.pk]
    assert due_at(row.pk) == rule(row.pk) == (later if result == RETRY else None)


@pytest.mark.django_db
def test_a_lapsed_lease_is_given_back_by_the_next_claim_and_claimed_as_recovered(clock):
    channel = ChannelFactory(key="in_app", timeout_seconds=5)
    (row,) = due_notifications(clock, channel, 1)
    plan = [ChannelClaim(channel.pk, 10, 40.0)]
    budgets = {channel.pk: (channel.max_attempts, channel.key)}
    (first,) = claim_due(ClaimRequest(clock.now(), plan, total=10, budgets=budgets)).records
    assert NotificationEntity.objects.due(clock.now() + timedelta(seconds=39)).count() == 0
    clock.advance(41)  # its worker died: the lease lapses
    trigger_off()  # the give-back writes the rule itself
    (again,) = claim_due(ClaimRequest(clock.now(), plan, total=10, budgets=budgets)).records
    assert again.id == row.pk and again.claim_token != first.claim_token
    assert again.attempts == first.attempts + 1, "the lapsed attempt stays counted"
    assert due_at(row.pk) is None and lease_expiry(row.pk) == clock.now() + timedelta(seconds=40)


@pytest.mark.django_db
def test_a_lease_given_back_keeps_its_token_and_is_due_since_then(clock):
    (row,) = due_notifications(clock, ChannelFactory(key="in_app"), 1)
    token_and_expiry = (
        f"UPDATE {TABLE} SET claim_token = gen_random_uuid(), claim_expires_at = %s, updated_at = %s "
        "WHERE id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(token_and_expiry, [clock.now() + timedelta(seconds=30), clock.now(), row.pk])
        assert due_at(row.pk) is None
        given_back = clock.now() + timedelta(seconds=31)
        cursor.execute(
            f"UPDATE {TABLE} SET claim_expires_at = NULL, updated_at = %s WHERE id = %s", [given_back, row.pk]
        )
        assert due_at(row.pk) == rule(row.pk) == given_back
        assert NotificationEntity.objects.due(given_back).filter(pk=row.pk).exists()
