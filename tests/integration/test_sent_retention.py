"""Retention of Sent rows (SENT_RETENTION_DAYS): off by default; on, housekeeping deletes old Sent rows in
batches, with what only they give meaning to, and nothing else."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from notifications_retry.conf import RetrySettings, settings_problems
from notifications_retry.delivery.retention import prune_sent_batch, prune_sent_batches
from notifications_retry.housekeeping import run_housekeeping
from notifications_retry.models import DeadLetterAction, DeliveryStatus, NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

Status = NotificationEntity.Status


def row(status: str, age_days: float, **fields) -> NotificationEntity:
    """A notification last written ``age_days`` ago."""
    when = timezone.now() - timedelta(days=age_days)
    created = NotificationFactory(
        channel=ChannelFactory(key="in_app"), status=status, attempts=1 if status != Status.PENDING else 0
    )
    # Sent is final (a trigger refuses most changes), but its updated_at is the app's to set.
    NotificationEntity.objects.filter(pk=created.pk).update(updated_at=when, created_at=when, **fields)
    return created


def remaining() -> set:
    return set(NotificationEntity.objects.values_list("pk", flat=True))


@pytest.mark.django_db
def test_off_by_default_nothing_sent_is_deleted():
    old = row(Status.SENT, 400)
    report = run_housekeeping()
    assert report.pruned_sent == 0
    assert old.pk in remaining()


@pytest.mark.django_db
def test_on_it_deletes_sent_rows_older_than_the_retention_and_nothing_else(settings):
    settings.NOTIFICATIONS_RETRY = {"SENT_RETENTION_DAYS": 30}
    old_sent = row(Status.SENT, 31)
    recent_sent = row(Status.SENT, 29)
    old_failed = row(Status.FAILED, 90, next_attempt_at=timezone.now() + timedelta(days=1))
    old_pending = row(Status.PENDING, 90)
    # What only the old Sent row gives meaning to goes with it: the ESP's report, the triage audit.
    DeliveryStatus.objects.create(notification=old_sent, state="delivered", state_at=timezone.now())
    DeadLetterAction.objects.create(notification=old_sent, action="requeue", actor="ops")
    DeliveryStatus.objects.create(notification=recent_sent, state="opened", state_at=timezone.now())
    events_before = Outbox.objects.count()

    report = run_housekeeping()

    assert report.pruned_sent == 1
    assert remaining() == {recent_sent.pk, old_failed.pk, old_pending.pk}
    assert not DeliveryStatus.objects.filter(notification_id=old_sent.pk).exists()
    assert not DeadLetterAction.objects.filter(notification_id=old_sent.pk).exists()
    assert DeliveryStatus.objects.filter(notification_id=recent_sent.pk).exists()
    assert Outbox.objects.count() == events_before  # events are the outbox's retention's
    assert run_housekeeping().pruned_sent == 0  # idempotent


@pytest.mark.django_db
def test_a_pass_walks_the_table_in_batches_each_deleting_only_its_own_old_rows():
    old = [row(Status.SENT, 40) for _ in range(7)]
    kept = [row(Status.SENT, 1) for _ in range(3)] + [row(Status.FAILED, 40) for _ in range(2)]
    per_batch = list(prune_sent_batches(older_than=timezone.now() - timedelta(days=30), scan=3))
    # 12 rows walked 3 at a time: 4 full batches, then one that finds the end.
    assert len(per_batch) == 5
    assert all(n <= 3 for n in per_batch) and sum(per_batch) == len(old)
    assert remaining() == {r.pk for r in kept}


@pytest.mark.django_db
def test_one_batch_says_where_the_next_starts_and_none_at_the_end():
    rows = sorted([row(Status.SENT, 40) for _ in range(5)], key=lambda r: r.pk)
    cutoff = timezone.now() - timedelta(days=30)
    deleted, after = prune_sent_batch(older_than=cutoff, after=None, scan=2)
    assert deleted == 2 and after == rows[1].pk
    deleted, after = prune_sent_batch(older_than=cutoff, after=after, scan=10)
    assert deleted == 3 and after is None
    assert not remaining()


@pytest.mark.django_db
def test_the_command_takes_the_retention_as_an_option(capsys):
    old = row(Status.SENT, 10)
    call_command("notifications_housekeeping")
    assert "deleted 0 Sent notification(s)" in capsys.readouterr().out
    call_command("notifications_housekeeping", "--sent-days", "7")
    assert "deleted 1 Sent notification(s)" in capsys.readouterr().out
    assert old.pk not in remaining()


@pytest.mark.parametrize("value", [0, -1, 36_501, 1.5, "30", True])
def test_a_retention_that_is_not_whole_days_is_refused_with_the_reason(value):
    problems = settings_problems(dataclasses.replace(RetrySettings(), SENT_RETENTION_DAYS=value))
    assert [p for p in problems if p.startswith("SENT_RETENTION_DAYS must be an integer from 1 to 36500")]


def test_none_and_whole_days_are_accepted():
    for value in (None, 1, 30, 36_500):
        assert settings_problems(dataclasses.replace(RetrySettings(), SENT_RETENTION_DAYS=value)) == []
