"""Security of the triage console: permissions answer 403 with no state change, CSRF, escaping."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from notifications_retry.models import DeadLetterAction, NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.admin_pages import CHANGELIST, DASHBOARD, action, dead_letter, outbox_event, staff

pytestmark = pytest.mark.django_db

XSS = '<script>alert("xss")</script>'


def snapshot(row: NotificationEntity) -> tuple[Any, ...]:
    row.refresh_from_db()
    return (row.status, row.attempts, row.dead_lettered_at, row.resolution, row.requeue_count, row.updated_at)


def assert_untouched(row: NotificationEntity, before: tuple[Any, ...]) -> None:
    assert snapshot(row) == before
    assert not DeadLetterAction.objects.filter(notification=row).exists()
    assert not LogEntry.objects.filter(object_id=str(row.pk)).exists()


@pytest.mark.parametrize(
    ("perms", "action_name"),
    [
        (("view_notificationentity",), "requeue_selected"),
        (("view_notificationentity",), "discard_selected"),
        (("view_notificationentity", "discard_notificationentity"), "requeue_selected"),
        (("view_notificationentity", "requeue_notificationentity"), "discard_selected"),
    ],
)
def test_actions_without_their_permission_are_403(perms: tuple[str, ...], action_name: str) -> None:
    row = dead_letter()
    before = snapshot(row)
    client = staff(*perms)
    assert action(client, action_name, [row.pk]).status_code == 403
    assert action(client, action_name, [row.pk], confirm="yes", reason="x").status_code == 403
    assert (
        action(client, action_name, [row.pk], select_across="1", confirm="yes", reason="x").status_code == 403
    )
    assert_untouched(row, before)


def test_actions_are_not_offered_without_permission() -> None:
    row = dead_letter()
    response = staff("view_notificationentity").get(reverse(CHANGELIST))
    assert response.status_code == 200  # the list answered: the absence below means something
    html = response.content.decode()
    assert str(row.pk)[:8] in html
    assert "requeue_selected" not in html and "discard_selected" not in html


@pytest.mark.parametrize("operation", ["requeue", "discard"])
def test_detail_triage_urls_without_permission_are_403(operation: str) -> None:
    row = dead_letter()
    before = snapshot(row)
    client = staff("view_notificationentity")
    url = reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, operation])
    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "x", "confirm": "yes"}).status_code == 403
    assert_untouched(row, before)
    page = client.get(reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]))
    assert page.status_code == 200
    assert url not in page.content.decode()


def test_unknown_triage_operation_is_403(admin_client: Client) -> None:
    row = dead_letter()
    url = reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, "delete"])
    assert admin_client.post(url, {"reason": "x"}).status_code == 403


def test_dashboard_and_lists_need_view_permission() -> None:
    row = dead_letter()
    client = staff()  # staff, no permission at all
    assert client.get(reverse(DASHBOARD)).status_code == 403
    assert client.get(reverse(CHANGELIST)).status_code == 403
    detail = reverse("admin:notifications_retry_notificationentity_change", args=[row.pk])
    assert client.get(detail).status_code == 403
    assert client.get(reverse("admin:notifications_retry_outbox_changelist")).status_code == 403


def test_anonymous_users_are_sent_to_the_login_page() -> None:
    row = dead_letter()
    before = snapshot(row)
    client = Client()
    for url in (reverse(DASHBOARD), reverse(CHANGELIST)):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    url = reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, "requeue"])
    assert client.post(url, {"reason": "x", "confirm": "yes"}).status_code == 302
    assert_untouched(row, before)


def test_channel_changes_without_change_permission_are_403() -> None:
    channel = ChannelFactory(key="email", is_enabled=True)
    client = staff("view_channelconfig")
    url = reverse("admin:notifications_retry_channelconfig_changelist")
    assert (
        client.post(
            url, {"action": "disable_channels", "_selected_action": [channel.pk], "index": 0}
        ).status_code
        == 403
    )
    data = {"form-TOTAL_FORMS": "1", "form-INITIAL_FORMS": "1", "form-0-id": channel.pk, "_save": "Save"}
    assert client.post(url, data).status_code == 403
    change = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    assert client.post(change, {"key": "email", "provider_key": "in_app"}).status_code == 403
    channel.refresh_from_db()
    assert channel.is_enabled


def test_outbox_accepts_no_post() -> None:
    row = dead_letter()
    event = outbox_event(row)
    client = staff("view_outbox")
    url = reverse("admin:notifications_retry_outbox_changelist")
    assert (
        client.post(
            url, {"action": "delete_selected", "_selected_action": [event.pk], "index": 0}
        ).status_code
        == 403
    )
    change = reverse("admin:notifications_retry_outbox_change", args=[event.pk])
    assert client.post(change, {"topic": "x"}).status_code == 403
    event.refresh_from_db()
    assert event.topic == "pin.notifications.dispatched.v1"


def test_post_without_csrf_token_fails() -> None:
    row = dead_letter()
    channel = ChannelFactory(key="sms", is_enabled=True)
    before = snapshot(row)
    user = User.objects.create_superuser("root", "root@example.com", password=None)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert action(client, "requeue_selected", [row.pk], confirm="yes", reason="x").status_code == 403
    url = reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, "requeue"])
    assert client.post(url, {"reason": "x", "confirm": "yes"}).status_code == 403
    channels = reverse("admin:notifications_retry_channelconfig_changelist")
    assert (
        client.post(
            channels, {"action": "disable_channels", "_selected_action": [channel.pk], "index": 0}
        ).status_code
        == 403
    )
    assert_untouched(row, before)
    channel.refresh_from_db()
    assert channel.is_enabled
    # the same request with the token from the confirmation page goes through
    page = client.post(
        reverse(CHANGELIST),
        {
            "action": "requeue_selected",
            "_selected_action": [str(row.pk)],
            "index": "0",
            "select_across": "0",
            "csrfmiddlewaretoken": "bad",
        },
    )
    assert page.status_code == 403
    confirmation = client.get(url)
    token = confirmation.context["csrf_token"]
    assert (
        client.post(url, {"reason": "ok", "confirm": "yes", "csrfmiddlewaretoken": str(token)}).status_code
        == 302
    )
    row.refresh_from_db()
    assert row.dead_lettered_at is None


def test_script_in_errors_and_payloads_is_escaped_everywhere(admin_client: Client) -> None:
    channel = ChannelFactory(
        key="webhook", provider_key="webhook", options={"url": "https://hooks.example.com/"}
    )
    row = dead_letter(
        channel=channel,
        last_error=XSS,
        dead_letter_reason=XSS,
        error_kind=XSS[:60],
        provider_message_id=XSS,
        recipient=f"{XSS}@example.com",
        payload={"body": XSS, XSS: [XSS]},
        attempt_log=[{"at": XSS, "attempt": 1, "outcome": XSS, "error_kind": XSS, "error": XSS}],
    )
    DeadLetterAction.objects.create(notification=row, action="requeue", actor=XSS[:150], reason=XSS)
    outbox_event(row)
    NotificationFactory(status="failed", error_kind=XSS[:60], last_error=XSS)
    pages = [
        reverse(CHANGELIST),
        reverse(CHANGELIST) + "?dead_letter=yes",
        reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]),
        reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, "requeue"]),
        reverse(DASHBOARD),
        reverse("admin:notifications_retry_outbox_changelist"),
        reverse("admin:notifications_retry_deadletteraction_changelist"),
    ]
    confirmation = action(admin_client, "discard_selected", [row.pk])
    assert confirmation.status_code == 200
    for url in pages:
        response = admin_client.get(url)
        assert response.status_code == 200, url
        html = response.content.decode()
        assert "<script>alert" not in html, url
    assert "<script>alert" not in confirmation.content.decode()
    detail = admin_client.get(pages[2])
    assert detail.status_code == 200
    assert "&lt;script&gt;alert(&quot;xss&quot;)&lt;/script&gt;" in detail.content.decode()


def test_script_in_a_channel_problem_is_escaped_in_the_channel_list(admin_client: Client) -> None:
    ChannelFactory(key="hook", provider_key=XSS, options={})  # an unknown provider, named in the problem
    response = admin_client.get(reverse("admin:notifications_retry_channelconfig_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "broken" in html  # the problem is shown ...
    assert "<script>alert" not in html  # ... escaped
    assert "&lt;script&gt;alert" in html
