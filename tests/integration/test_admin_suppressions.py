"""The suppression list in the admin: search, add and remove through the service, each change audited;
delivery statuses listed and shown on the notification's page."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from notifications_retry import api
from notifications_retry.models import DeliveryStatus, NotificationEntity, Suppression, SuppressionChange
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.admin_pages import assert_admin_times

pytestmark = pytest.mark.django_db

LIST = "admin:notifications_retry_suppression_changelist"
ADD = "admin:notifications_retry_suppression_add"


def operator(*codenames: str) -> Client:
    user = User.objects.create_user("operator", is_staff=True)  # no password: no slow hashing
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="notifications_retry", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


def test_search_finds_an_address_however_it_is_typed(admin_client):
    api.suppress("Ann@example.com")
    api.suppress("bob@example.com")
    response = admin_client.get(reverse(LIST), {"q": "ANN@EXAMPLE.COM"})
    assert response.status_code == 200
    assert b"ann@example.com" in response.content and b"bob@example.com" not in response.content
    response = admin_client.get(reverse(LIST), {"q": "bob"})
    assert b"bob@example.com" in response.content and b"ann@example.com" not in response.content


def test_adding_goes_through_the_service_normalized_and_audited(admin_client):
    ChannelFactory(key="email")
    response = admin_client.post(
        reverse(ADD),
        {
            "address": "Carol@Example.COM",
            "channel": "email",
            "reason": "manual",
            "expires_at": "",
            "note": "asked us",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    row = Suppression.objects.get()
    assert (row.address, row.channel, row.reason, row.source) == (
        "carol@example.com",
        "email",
        "manual",
        "operator: admin",
    )
    change = SuppressionChange.objects.get()
    assert (change.action, change.actor, change.note, change.channel) == ("add", "admin", "asked us", "email")
    assert LogEntry.objects.filter(object_id=str(row.pk)).exists()
    assert api.is_suppressed("Carol@example.com", channel="email")


def test_an_empty_address_or_an_unknown_channel_is_refused_and_writes_nothing(admin_client):
    for data in ({"address": "  ", "channel": "*"}, {"address": "a@example.com", "channel": "nope"}):
        response = admin_client.post(reverse(ADD), {"reason": "manual", "expires_at": "", **data})
        assert response.status_code == 200 and b"errornote" in response.content
    assert not Suppression.objects.exists() and not SuppressionChange.objects.exists()


def test_removing_one_entry_removes_that_entry_only_and_is_audited(admin_client):
    ChannelFactory(key="email")
    star = api.suppress("ann@example.com")
    own = api.suppress("ann@example.com", channel="email")
    url = reverse("admin:notifications_retry_suppression_delete", args=[star.pk])
    assert admin_client.post(url, {"post": "yes"}).status_code == 302
    assert list(Suppression.objects.values_list("pk", flat=True)) == [own.pk]
    removed = SuppressionChange.objects.get(action="remove")
    assert (removed.address, removed.channel, removed.actor) == ("ann@example.com", "*", "admin")


def test_the_bulk_delete_action_is_audited_per_entry(admin_client):
    rows = [api.suppress(f"user{i}@example.com") for i in range(3)]
    data = {"action": "delete_selected", "_selected_action": [r.pk for r in rows], "post": "yes"}
    assert admin_client.post(reverse(LIST), data).status_code == 302
    assert not Suppression.objects.exists()
    assert SuppressionChange.objects.filter(action="remove", actor="admin").count() == 3


def test_entries_are_never_edited_in_place(admin_client):
    row = api.suppress("ann@example.com")
    url = reverse("admin:notifications_retry_suppression_change", args=[row.pk])
    admin_client.post(url, {"address": "other@example.com", "channel": "*", "reason": "complaint"})
    row.refresh_from_db()
    assert (row.address, row.reason) == ("ann@example.com", "manual")


def test_without_the_permissions_an_operator_can_neither_add_nor_remove():
    row = api.suppress("ann@example.com")
    client = operator("view_suppression")
    assert client.get(reverse(LIST)).status_code == 200
    assert (
        client.post(
            reverse(ADD), {"address": "x@example.com", "channel": "*", "reason": "manual"}
        ).status_code
        == 403
    )
    url = reverse("admin:notifications_retry_suppression_delete", args=[row.pk])
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert list(Suppression.objects.values_list("address", flat=True)) == ["ann@example.com"]
    assert SuppressionChange.objects.filter(action="remove").count() == 0


def test_delivery_status_is_listed_and_shown_on_the_notification_page(admin_client):
    row = NotificationFactory(
        channel=ChannelFactory(key="email", provider_key="django_email"),
        status=NotificationEntity.Status.SENT,
        provider_message_id="pm-1",
    )
    at = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    DeliveryStatus.objects.create(
        notification=row, state="opened", state_at=at, esp="Postmark", delivered_at=at, opened_at=at
    )
    page = admin_client.get(reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]))
    assert (
        b"Opened (by Postmark): delivered 2026-03-01 10:00:00 UTC; opened 2026-03-01 10:00:00 UTC"
        in page.content
    )
    listing = admin_client.get(
        reverse("admin:notifications_retry_deliverystatus_changelist"), {"state": "opened"}
    )
    assert listing.status_code == 200 and str(row.pk)[:8].encode() in listing.content


def test_the_suppression_pages_show_every_time_in_the_admin_format(admin_client):
    """The list, an entry's page, the audit and the delivery statuses: "2026-03-01 10:00:00 UTC", as
    every other admin page, not Django's "March 1, 2026, 10 a.m."."""
    at = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    entry = Suppression.objects.create(
        address="ann@example.com",
        reason="hard_bounce",
        source="Postmark",
        first_event_at=at,
        last_event_at=at,
        expires_at=datetime(2027, 3, 1, 10, 0, tzinfo=UTC),
    )
    change = SuppressionChange.objects.create(
        address="ann@example.com", channel="*", action="add", reason="manual", actor="ann", created_at=at
    )
    row = NotificationFactory(
        channel=ChannelFactory(key="email", provider_key="django_email"),
        status=NotificationEntity.Status.SENT,
        provider_message_id="pm-1",
    )
    DeliveryStatus.objects.create(
        notification=row, state="delivered", state_at=at, esp="Postmark", delivered_at=at, updated_at=at
    )
    pages = {
        reverse(LIST): 2,  # last event, expiry
        reverse("admin:notifications_retry_suppression_change", args=[entry.pk]): 3,
        reverse("admin:notifications_retry_suppressionchange_changelist"): 1,
        reverse("admin:notifications_retry_suppressionchange_change", args=[change.pk]): 1,
        reverse("admin:notifications_retry_deliverystatus_changelist"): 2,
        reverse("admin:notifications_retry_deliverystatus_change", args=[row.pk]): 3,
    }
    for url, least in pages.items():
        response = admin_client.get(url)
        assert response.status_code == 200, url
        stamps = assert_admin_times(response.content.decode())
        assert "2026-03-01 10:00:00 UTC" in stamps and len(stamps) >= least, (url, stamps)
