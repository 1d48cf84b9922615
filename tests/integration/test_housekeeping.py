"""Housekeeping: dead-letter expiry by retention, pruning of published outbox rows and backlog samples."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from notifications_retry import api
from notifications_retry.delivery import events
from notifications_retry.housekeeping import prune_published_outbox, run_housekeeping
from notifications_retry.models import (
    BacklogSample,
    ChannelHealthBucket,
    DeadLetterAction,
    NotificationEntity,
    Outbox,
)
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status


def dead_letter(age: timedelta, **fields) -> NotificationEntity:
    return NotificationFactory(
        channel=ChannelFactory(key="email"),
        status=Status.FAILED,
        attempts=3,
        dead_lettered_at=timezone.now() - age,
        error_kind="http_4xx",
        last_error="HTTP 410",
        **fields,
    )


def sent_event(published_age: timedelta | None) -> Outbox:
    row = NotificationFactory(channel=ChannelFactory(key="in_app"), status=Status.SENT, attempts=1)
    event = events.dispatched_event(
        generation=0,
        created_at=timezone.now() - timedelta(days=60),
        notification_id=row.pk,
        tenant_id=None,
        channel="in_app",
        status="Sent",
        attempts=1,
        provider_message_id="p",
        error=None,
        error_kind=None,
    )
    event.save(force_insert=True)
    if published_age is not None:
        Outbox.objects.filter(pk=event.pk).update(published_at=timezone.now() - published_age)
    return event


def test_expires_unresolved_dead_letters_past_the_retention(settings):
    settings.NOTIFICATIONS_RETRY = {"DEAD_LETTER_RETENTION_DAYS": 30}
    stale = dead_letter(timedelta(days=31))
    fresh = dead_letter(timedelta(days=29))
    discarded = dead_letter(timedelta(days=90), resolution="discarded", resolved_at=timezone.now())
    report = run_housekeeping()
    assert report.expired_dead_letters == 1
    stale.refresh_from_db()
    assert stale.resolution == "unresolvable" and stale.status == Status.FAILED
    assert DeadLetterAction.objects.get(notification=stale).action == "expire"
    fresh.refresh_from_db()
    discarded.refresh_from_db()
    assert (fresh.resolution, discarded.resolution) == ("", "discarded")
    assert run_housekeeping().expired_dead_letters == 0  # idempotent


def test_prunes_published_outbox_rows_past_their_retention_and_never_unpublished_ones(settings):
    settings.NOTIFICATIONS_RETRY = {"OUTBOX_RETENTION_DAYS": 7}
    old = sent_event(timedelta(days=8))
    recent = sent_event(timedelta(days=6))
    unpublished = sent_event(None)  # created 60 days ago, still waiting for the relay
    assert run_housekeeping().pruned_outbox == 1
    assert set(Outbox.objects.values_list("pk", flat=True)) == {recent.pk, unpublished.pk}
    assert old.pk not in set(Outbox.objects.values_list("pk", flat=True))


def test_pruning_works_in_chunks():
    for _ in range(7):
        sent_event(timedelta(days=30))
    assert prune_published_outbox(older_than=timezone.now() - timedelta(days=1), chunk=3) == 7
    assert not Outbox.objects.exists()


def test_prunes_backlog_samples_older_than_two_days():
    now = timezone.now()
    for hours in (1, 47, 49, 24 * 10):
        BacklogSample.objects.create(taken_at=now - timedelta(hours=hours))
    assert run_housekeeping(now=now).pruned_backlog_samples == 2
    ages = sorted(
        (now - t).total_seconds() / 3600 for t in BacklogSample.objects.values_list("taken_at", flat=True)
    )
    assert [round(a) for a in ages] == [1, 47]


def test_housekeeping_never_breaks_the_invariants():
    """A cancelled (resolved) row and a Sent row are left as they are; nothing changes status."""
    cancelled = NotificationFactory(channel=ChannelFactory(key="in_app"))
    api.cancel_notification(cancelled.pk, actor="shop")
    sent_event(timedelta(days=365))
    stale = dead_letter(timedelta(days=400))
    before = dict(NotificationEntity.objects.values_list("pk", "status"))
    run_housekeeping()
    assert dict(NotificationEntity.objects.values_list("pk", "status")) == before
    stale.refresh_from_db()
    assert stale.resolution == "unresolvable"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM notifications_retry_outbox WHERE published_at IS NULL")
        assert cursor.fetchone()[0] == 1  # the cancellation's event, not yet relayed, survives


def test_command_reports_counts_and_takes_retentions_as_options(capsys):
    dead_letter(timedelta(days=3))
    sent_event(timedelta(days=2))
    BacklogSample.objects.create(taken_at=timezone.now() - timedelta(hours=5))
    call_command("notifications_housekeeping")
    assert (
        "expired 0 dead letter(s), pruned 0 outbox event(s) and 0 backlog sample(s)"
        in capsys.readouterr().out
    )
    call_command(
        "notifications_housekeeping", "--dead-letter-days", "2", "--outbox-days", "1", "--sample-hours", "4"
    )
    assert (
        "expired 1 dead letter(s), pruned 1 outbox event(s) and 1 backlog sample(s)"
        in capsys.readouterr().out
    )


def test_prunes_endpoint_health_buckets_that_left_the_window(settings):
    # 24 buckets of an hour: the oldest one that still overlaps the window stays, older ones go.
    settings.NOTIFICATIONS_RETRY = {"ENDPOINT_HEALTH": {"window_seconds": 86_400}}
    now = timezone.now().replace(minute=30, second=0, microsecond=0)
    channel = ChannelFactory(key="hook")
    hour = now.replace(minute=0)
    for hours_ago in (0, 23, 24, 25, 48):
        ChannelHealthBucket.objects.create(
            channel=channel, bucket_start=hour - timedelta(hours=hours_ago), attempts=10, failures=10
        )
    report = run_housekeeping(now=now)
    assert report.pruned_health_buckets == 2
    kept = sorted(
        (hour - b).total_seconds() / 3600
        for b in ChannelHealthBucket.objects.values_list("bucket_start", flat=True)
    )
    assert kept == [0, 23, 24]
