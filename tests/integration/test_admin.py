"""The triage console on a real PostgreSQL: the list, its filters and search, and the detail page
(the actions: test_admin_actions.py)."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.models import (
    DeadLetterAction,
    NotificationEntity,
)
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.admin_pages import (
    CHANGELIST,
    admin_user,  # noqa: F401  (a fixture: the superuser without a password)
    dead_letter,
    ids_in,
    outbox_event,
    staff,
)
from tests.support.mailers import mailer_options_for

pytestmark = pytest.mark.django_db


# --- list, filters, search -----------------------------------------------------------------------------


def test_list_shows_the_triage_columns_only(admin_client: Client) -> None:
    row = dead_letter(recipient="alice.secret@example.com", requeue_count=0)
    response = admin_client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', response.content.decode())
    assert columns == [
        "short_id",
        "status_badge",
        "channel",
        "error_kind_display",
        "attempts_display",
        "due_display",
        "age",
    ]
    html = response.content.decode()
    assert "alice.secret@example.com" not in html and "a***@e***.com" not in html  # on the detail page
    assert str(row.pk)[:8] in html
    assert ">dead letter</span>" in html and ">http_4xx</span>" in html and ">3/3" in html


def test_status_badge_says_dead_letter_discarded_or_status() -> None:
    from notifications_retry.admin.display import state_label

    now = timezone.now()
    assert state_label(dead_letter()) == ("dead letter", "dead")
    assert state_label(dead_letter(resolution="discarded", resolved_at=now)) == ("discarded", "resolved")
    assert state_label(dead_letter(resolution="unresolvable", resolved_at=now)) == (
        "unresolvable",
        "resolved",
    )
    retrying = NotificationFactory(status="failed", attempts=1, next_attempt_at=now)
    assert state_label(retrying) == ("failed", "failed")


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({}, "Dead letter"),
        ({"resolution": "discarded"}, "Discarded"),
        ({"dead_lettered_at": None, "dead_letter_reason": "", "attempts": 1}, "Failed"),
    ],
)
def test_detail_page_title_says_what_its_badge_says(
    admin_client: Client, fields: dict[str, Any], words: str
) -> None:
    if fields.get("resolution"):
        fields["resolved_at"] = timezone.now()
    row = dead_letter(**fields)
    response = admin_client.get(reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    title = re.search(r"<title>(.*?)</title>", html, re.S)
    assert title is not None and title.group(1).startswith(f"{words}: {row.pk} on {row.channel.key} |")
    assert f"<h2>{words}: {row.pk}" in html
    assert f">{words.lower()}</span>" in html  # the badge
    breadcrumbs = re.search(r'<div class="breadcrumbs">(.*?)</div>', html, re.S)
    assert breadcrumbs is not None and f"{words}: {row.pk}" in breadcrumbs.group(1)
    assert "(failed)" not in title.group(1) + breadcrumbs.group(1)


def test_channel_list_shows_a_broken_channel_next_to_its_key(admin_client: Client) -> None:
    ChannelFactory(key="good", provider_key="in_app", options={})
    ChannelFactory(key="bad", provider_key="no-such-provider", options={})
    response = admin_client.get(reverse("admin:notifications_retry_channelconfig_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    columns = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert columns[:2] == ["key", "health"]
    assert len(columns) <= 7
    bad_row = next(r for r in html.split("<tr") if ">bad</a>" in r)
    assert ">broken</span>" in bad_row and "no-such-provider" in bad_row
    good_row = next(r for r in html.split("<tr") if ">good</a>" in r)
    assert ">ok</span>" in good_row


def test_channel_list_shows_an_esp_channel_without_its_credentials_as_failing_not_ok(
    admin_client: Client, settings: Any
) -> None:
    settings.ANYMAIL = {}
    options = mailer_options_for(settings)("anymail.backends.postmark.EmailBackend")
    channel = ChannelFactory(key="email", provider_key="django_email", options=options)
    html = admin_client.get(reverse("admin:notifications_retry_channelconfig_changelist")).content.decode()
    row = next(r for r in html.split("<tr") if ">email</a>" in r)
    assert ">will fail</span>" in row and "server_token" in row.lower() and ">ok</span>" not in row
    page = admin_client.get(reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk]))
    assert "every send will fail" in page.content.decode()
    settings.ANYMAIL = {"POSTMARK_SERVER_TOKEN": "t"}
    html = admin_client.get(reverse("admin:notifications_retry_channelconfig_changelist")).content.decode()
    assert ">ok</span>" in next(r for r in html.split("<tr") if ">email</a>" in r)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("?dead_letter=yes", {"dead", "discarded"}),
        ("?dead_letter=unresolved", {"dead"}),
        ("?dead_letter=no", {"sent", "retrying"}),
        ("?resolution=discarded", {"discarded"}),
        ("?resolution=unresolved", {"dead"}),
        ("?status__exact=sent", {"sent"}),
        ("?error_kind=timeout", {"retrying"}),
        ("?priority__exact=0", {"sent"}),
        ("?queue=due", {"retrying"}),
        ("?tenant=none", {"discarded"}),
    ],
)
def test_filters(admin_client: Client, query: str, expected: set[str]) -> None:
    now = timezone.now()
    rows = {
        "dead": dead_letter(),
        "discarded": dead_letter(resolution="discarded", resolved_at=now, tenant_id=None),
        "sent": NotificationFactory(status="sent", priority=0, provider_message_id="pm-1"),
        "retrying": NotificationFactory(
            status="failed", attempts=1, error_kind="timeout", next_attempt_at=now - timedelta(minutes=1)
        ),
    }
    response = admin_client.get(reverse(CHANGELIST) + query)
    assert response.status_code == 200
    assert ids_in(response) == {str(rows[name].pk) for name in expected}


def test_queue_state_filter_knows_leased_lapsed_due_and_waiting_rows(admin_client: Client) -> None:
    now = timezone.now()
    failed = {"status": "failed", "attempts": 1}
    rows = {
        "due": NotificationFactory(**failed, next_attempt_at=now - timedelta(minutes=1)),
        "waiting": NotificationFactory(**failed, next_attempt_at=now + timedelta(minutes=5)),
        "leased": NotificationFactory(**failed, next_attempt_at=now - timedelta(minutes=1)),
        "lapsed": NotificationFactory(**failed, next_attempt_at=now - timedelta(minutes=1)),
        "dead worker's": NotificationFactory(**failed, next_attempt_at=now - timedelta(minutes=1)),
    }
    lease = {"claim_token": uuid.uuid4(), "updated_at": now - timedelta(seconds=5)}
    NotificationEntity.objects.filter(pk=rows["leased"].pk).update(
        **lease, claim_expires_at=now + timedelta(minutes=1)
    )
    # A lease given back after its worker died: the token kept, the expiry cleared, due again.
    NotificationEntity.objects.filter(pk=rows["lapsed"].pk).update(**lease, claim_expires_at=None)
    # Past its expiry, not given back yet (no claim ran since its worker died): due as well.
    NotificationEntity.objects.filter(pk=rows["dead worker's"].pk).update(
        claim_token=uuid.uuid4(), claim_expires_at=now - timedelta(seconds=1)
    )
    expected = {"due": {"due", "lapsed", "dead worker's"}, "in_flight": {"leased"}, "waiting": {"waiting"}}
    for state, names in expected.items():
        response = admin_client.get(reverse(CHANGELIST) + f"?queue={state}")
        assert ids_in(response) == {str(rows[name].pk) for name in names}, state
    change = "admin:notifications_retry_notificationentity_change"
    detail = admin_client.get(reverse(change, args=[rows["lapsed"].pk])).content.decode()
    assert "lapsed (its worker stopped): due again" in detail
    listed = admin_client.get(reverse(CHANGELIST) + "?queue=in_flight").content.decode()
    assert "in flight" in listed
    listed = admin_client.get(reverse(CHANGELIST) + "?queue=due").content.decode()
    assert "in flight" not in listed and listed.count("ago</td>") == 3


def test_tenant_channel_and_date_range_filters(admin_client: Client) -> None:
    tenant = uuid.uuid4()
    email = ChannelFactory(key="email")
    old = dead_letter(tenant_id=tenant, channel=email, created_at=timezone.now() - timedelta(days=10))
    new = dead_letter(tenant_id=tenant)
    dead_letter()
    assert ids_in(admin_client.get(reverse(CHANGELIST) + f"?tenant={tenant}")) == {str(old.pk), str(new.pk)}
    assert ids_in(admin_client.get(reverse(CHANGELIST) + f"?channel__id__exact={email.pk}")) == {str(old.pk)}
    since = (timezone.now() - timedelta(days=11)).date().isoformat()
    until = (timezone.now() - timedelta(days=9)).date().isoformat()
    response = admin_client.get(reverse(CHANGELIST) + f"?created_at__from={since}&created_at__to={until}")
    assert ids_in(response) == {str(old.pk)}
    response = admin_client.get(reverse(CHANGELIST) + "?created_at__from=not-a-date")
    assert response.status_code == 302  # Django's answer to incorrect lookup parameters: back to the list


def test_search_by_id_tenant_and_provider_message_id(admin_client: Client) -> None:
    a = dead_letter(provider_message_id="prov-123")
    b = dead_letter()
    url = reverse(CHANGELIST)
    assert ids_in(admin_client.get(url, {"q": str(a.pk)})) == {str(a.pk)}
    assert ids_in(admin_client.get(url, {"q": str(b.tenant_id)})) == {str(b.pk)}
    assert ids_in(admin_client.get(url, {"q": "prov-123"})) == {str(a.pk)}
    assert ids_in(admin_client.get(url, {"q": "nothing-like-it"})) == set()


# --- detail page ---------------------------------------------------------------------------------------


def test_detail_is_read_only_with_payload_history_triage_log_and_outbox(admin_client: Client) -> None:
    row = dead_letter(payload={"subject": "Order 42", "lines": [1, 2]}, recipient="bob@example.com")
    DeadLetterAction.objects.create(
        notification=row, action="requeue", actor="carol", reason="provider fixed"
    )
    event = outbox_event(row)
    outbox_event(NotificationFactory(status="sent"))
    response = admin_client.get(reverse("admin:notifications_retry_notificationentity_change", args=[row.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "bob@example.com" in html  # the superuser holds view_recipient
    assert '"subject": "Order 42"' in html.replace("&quot;", '"')
    assert "webhook answered HTTP 400" in html
    assert "timed out" in html and "retry" in html  # attempt history
    assert "provider fixed" in html and "carol" in html  # triage log
    assert str(event.event_id) in html
    assert 'name="_save"' not in html and "<textarea" not in html  # nothing editable
    assert reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, "requeue"]) in html


def test_detail_masks_recipient_without_view_recipient_permission() -> None:
    row = dead_letter(recipient="+15551234567")
    url = reverse("admin:notifications_retry_notificationentity_change", args=[row.pk])
    response = staff("view_notificationentity").get(url)
    assert response.status_code == 200
    assert b"+15551234567" not in response.content
    assert b"+*********67" in response.content
    response = staff("view_notificationentity", "view_recipient", username="lead").get(url)
    assert response.status_code == 200
    assert b"+15551234567" in response.content
