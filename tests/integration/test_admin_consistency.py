"""The admin agrees with itself: one timestamp format with its zone, attempts that match the history,
a chart legend labelled with its sample's time beside cards counted now."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry import api
from notifications_retry.delivery import recovery
from notifications_retry.delivery.triage import requeue
from notifications_retry.models import (
    BacklogSample,
    ChannelHealthChange,
    DeliveryStatus,
    NotificationEntity,
    WorkerHeartbeat,
)
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.admin_pages import DASHBOARD, assert_admin_times, dead_letter, outbox_event

pytestmark = pytest.mark.django_db

STAMP = re.compile(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?::\d\d)?(?:\.\d+)?(?:[+-]\d\d:\d\d| UTC)?")


def detail(client: Client, row: NotificationEntity) -> str:
    response = client.get(reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_every_time_on_the_detail_page_has_one_format_and_its_zone(admin_client: Client) -> None:
    row = dead_letter(channel=ChannelFactory(key="webhook"), scheduled_at=timezone.now() - timedelta(hours=2))
    outbox_event(row)
    requeue([row.pk], actor="oncall", reason="provider fixed")
    page = detail(admin_client, NotificationEntity.objects.get(pk=row.pk))
    stamps = STAMP.findall(page)
    # created, updated, scheduled, due, next attempt, two attempts, the triage log, the event…
    assert len(stamps) >= 8, stamps
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", s) for s in stamps), stamps
    assert not re.search(r"\b[ap]\.m\.", page)  # Django's DATETIME_FORMAT is not used


def test_attempts_that_left_no_entry_are_said(admin_client: Client) -> None:
    log: list[dict[str, Any]] = [
        {"attempt": 3, "at": timezone.now().isoformat(), "outcome": "failed", "generation": 0, "error": "x"}
    ]
    row = dead_letter(channel=ChannelFactory(key="webhook"), attempt_log=log)
    page = detail(admin_client, row)
    assert "2 of the 3 attempts counted left no entry here" in page
    complete = dead_letter(
        channel=ChannelFactory(key="email"),
        attempt_log=[{**log[0], "attempt": n} for n in (1, 2, 3)],
    )
    assert "left no entry" not in detail(admin_client, complete)


def test_the_legend_says_when_its_sample_was_taken_and_the_cards_are_counted_now(
    admin_client: Client,
) -> None:
    channel = ChannelFactory(key="email")
    now = timezone.now()
    for _ in range(4):
        NotificationFactory(
            channel=channel, status="failed", attempts=1, next_attempt_at=now - timedelta(minutes=1)
        )
    taken = now - timedelta(minutes=14)
    BacklogSample.objects.create(
        taken_at=taken, due_backlog=2, failed_backlog=2, dead_letters_unresolved=0, oldest_due_age_seconds=5
    )
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    card = re.search(r'id="nr-card-due".*?nr-card-value">(\d+)<', page, re.S)
    assert card is not None and card[1] == "4"
    legend = re.search(r'id="nr-legend-time">(.*?)</li>', page, re.S)
    assert legend is not None
    text = " ".join(legend[1].split())
    assert timezone.localtime(taken).strftime("%Y-%m-%d %H:%M:%S") + " UTC" in text, text
    assert "(14m ago)" in text and "the cards above are counted now" in text
    assert "(now 2)" not in page


def test_every_admin_list_and_page_of_the_app_shows_times_in_one_format(admin_client: Client) -> None:
    """Each model the app registers, its list and one object's page: every time in the one format with
    its zone, never Django's "March 1, 2026, 10 a.m."."""
    now = timezone.now()
    channel = ChannelFactory(key="webhook")
    row = dead_letter(channel=channel)
    outbox_event(row, published=True)
    requeue([row.pk], actor="oncall", reason="provider fixed")
    sent = NotificationFactory(channel=channel, status="sent", provider_message_id="pm-1")
    DeliveryStatus.objects.create(notification=sent, state="delivered", state_at=now, delivered_at=now)
    api.suppress("ann@example.com")
    ChannelHealthChange.objects.create(channel=channel, state="disabled", previous_state="ok", reason="410")
    WorkerHeartbeat.objects.create(lane="default", last_tick_started_at=now, last_tick_completed_at=now)
    job = recovery.start_job(
        recovery.RecoveryFilter(channel=channel, since=now - timedelta(days=1), until=now), actor="ann"
    )
    recovery.run_job(job.pk)
    checked = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label != "notifications_retry":
            continue
        opts = model._meta
        listing = admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
        assert listing.status_code == 200, opts.model_name
        stamps = assert_admin_times(listing.content.decode())
        obj = model_admin.get_queryset(listing.wsgi_request).first()
        assert obj is not None, f"no {opts.model_name} to show"
        url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
        page = admin_client.get(url)
        assert page.status_code == 200, url
        stamps += assert_admin_times(page.content.decode())
        assert stamps, f"{opts.model_name}: no time shown at all"
        checked.append(opts.model_name)
    assert len(checked) >= 9, checked
