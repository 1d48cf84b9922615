"""The triage console on a real PostgreSQL: lists, filters, detail, actions, channels, outbox, dashboard."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.events import dispatched_event
from notifications_retry.models import (
    DeadLetterAction,
    NotificationEntity,
    Outbox,
)
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:notifications_retry_notificationentity_changelist"
DASHBOARD = "admin:notifications_retry_notificationentity_dashboard"


@pytest.fixture
def admin_user(db: None) -> User:
    """pytest-django's superuser, without a password (hashing one costs a second per test)."""
    return User.objects.create_superuser("admin", "admin@example.com", password=None)


def dead_letter(**fields: Any) -> NotificationEntity:
    """A terminal Failed row, as the worker leaves it."""
    now = timezone.now()
    values: dict[str, Any] = {
        "status": NotificationEntity.Status.FAILED,
        "attempts": 3,
        "error_kind": "http_4xx",
        "last_error": "webhook answered HTTP 400",
        "dead_lettered_at": now - timedelta(minutes=5),
        "dead_letter_reason": "permanent failure",
        "created_at": now - timedelta(hours=1),
        "attempt_log": [
            {
                "at": (now - timedelta(minutes=20)).isoformat(),
                "attempt": 1,
                "outcome": "retry",
                "error_kind": "timeout",
                "error": "timed out",
            },
            {
                "at": (now - timedelta(minutes=5)).isoformat(),
                "attempt": 2,
                "outcome": "failed",
                "error_kind": "http_4xx",
                "error": "webhook answered HTTP 400",
            },
        ],
    }
    values.update(fields)
    return NotificationFactory(**values)  # type: ignore[no-any-return]


def outbox_event(row: NotificationEntity, *, published: bool = False) -> Outbox:
    """The event the worker writes for a Sent or dead-lettered row (the database checks it matches)."""
    event = dispatched_event(
        generation=row.requeue_count,
        created_at=timezone.now(),
        notification_id=row.pk,
        tenant_id=row.tenant_id,
        channel=row.channel.key,
        status="Sent" if row.status == "sent" else "Failed",
        attempts=row.attempts,
        provider_message_id=row.provider_message_id,
        error=row.last_error,
        error_kind=row.error_kind,
    )
    event.save()
    if published:
        Outbox.objects.filter(pk=event.pk).update(published_at=timezone.now())
        event.refresh_from_db()
    return event


def staff(*perms: str, username: str = "operator") -> Client:
    """A logged-in staff client holding exactly ``perms`` (codenames of the app)."""
    user = User.objects.create_user(username, is_staff=True)  # no password: no slow hashing
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="notifications_retry", codename__in=perms)
    )
    client = Client()
    client.force_login(user)
    return client


def action(client: Client, name: str, ids: list[Any], query: str = "", **extra: Any) -> Any:
    data: dict[str, Any] = {
        "action": name,
        "_selected_action": [str(i) for i in ids],
        "index": "0",
        "select_across": "0",
        **extra,
    }
    return client.post(reverse(CHANGELIST) + query, data)


def ids_in(response: Any) -> set[str]:
    return {str(obj.pk) for obj in response.context["cl"].result_list}


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


# --- triage actions ------------------------------------------------------------------------------------


def test_requeue_asks_for_a_reason_then_calls_the_service_and_logs() -> None:
    row = dead_letter()
    client = staff("view_notificationentity", "requeue_notificationentity")
    confirm = action(client, "requeue_selected", [row.pk])
    assert confirm.status_code == 200
    assert confirm.context["total"] == 1 and confirm.context["eligible"] == 1
    row.refresh_from_db()
    assert row.dead_lettered_at is not None  # nothing happened yet

    no_reason = action(client, "requeue_selected", [row.pk], confirm="yes", reason="")
    assert no_reason.status_code == 200 and no_reason.context["form"].errors
    row.refresh_from_db()
    assert row.dead_lettered_at is not None

    done = action(client, "requeue_selected", [row.pk], confirm="yes", reason="provider is back")
    assert done.status_code == 302
    row.refresh_from_db()
    assert row.dead_lettered_at is None and row.attempts == 0 and row.requeue_count == 1
    audit = DeadLetterAction.objects.get(notification=row)
    assert (audit.action, audit.actor, audit.reason) == ("requeue", "operator", "provider is back")
    entry = LogEntry.objects.get(object_id=str(row.pk))
    assert "provider is back" in entry.get_change_message()
    messages = [str(m) for m in client.get(done["Location"]).context["messages"]]
    assert "Requeued 1 notification(s)." in messages


def test_requeue_refuses_rows_in_the_wrong_state_with_a_message() -> None:
    good = dead_letter()
    sent = NotificationFactory(status="sent")
    client = staff("view_notificationentity", "requeue_notificationentity")
    confirm = action(client, "requeue_selected", [good.pk, sent.pk])
    assert (confirm.context["eligible"], confirm.context["refused"]) == (1, 1)
    done = action(client, "requeue_selected", [good.pk, sent.pk], confirm="yes", reason="retry")
    page = client.get(done["Location"])
    messages = [str(m) for m in page.context["messages"]]
    assert "Requeued 1 notification(s)." in messages
    assert any("Refused 1" in m and "not a dead letter (status sent)" in m for m in messages)
    sent.refresh_from_db()
    assert sent.status == "sent" and sent.requeue_count == 0
    assert not LogEntry.objects.filter(object_id=str(sent.pk)).exists()


def test_discard_marks_resolution_and_refuses_already_discarded() -> None:
    row = dead_letter()
    gone = dead_letter(resolution="discarded", resolved_at=timezone.now())
    client = staff("view_notificationentity", "discard_notificationentity")
    done = action(client, "discard_selected", [row.pk, gone.pk], confirm="yes", reason="spam campaign")
    assert done.status_code == 302
    row.refresh_from_db()
    assert row.resolution == "discarded" and row.resolved_at is not None
    messages = [str(m) for m in client.get(done["Location"]).context["messages"]]
    assert "Discarded 1 notification(s)." in messages
    assert any("already discarded" in m for m in messages)


def test_apply_to_all_matching_the_filter_shows_count_and_respects_the_cap(settings: Any) -> None:
    rows = [dead_letter(error_kind="http_4xx") for _ in range(3)]
    other = dead_letter(error_kind="timeout")
    client = staff("view_notificationentity", "requeue_notificationentity")
    query = "?dead_letter=unresolved&error_kind=http_4xx"
    confirm = action(client, "requeue_selected", [rows[0].pk], query, select_across="1")
    assert confirm.status_code == 200
    assert confirm.context["total"] == 3 and confirm.context["across"]
    assert "match the current filter" in confirm.content.decode()

    settings.NOTIFICATIONS_RETRY = {"BULK_ACTION_CAP": 2}
    capped = action(
        client, "requeue_selected", [rows[0].pk], query, select_across="1", confirm="yes", reason="x"
    )
    assert capped.status_code == 302
    messages = [str(m) for m in client.get(capped["Location"]).context["messages"]]
    assert any("cap for one action is 2" in m for m in messages)
    assert NotificationEntity.objects.filter(dead_lettered_at__isnull=True).count() == 0

    settings.NOTIFICATIONS_RETRY = {"BULK_ACTION_CAP": 3}
    done = action(
        client,
        "requeue_selected",
        [rows[0].pk],
        query,
        select_across="1",
        confirm="yes",
        reason="bad template fixed",
    )
    assert done.status_code == 302
    assert set(
        NotificationEntity.objects.filter(dead_lettered_at__isnull=True).values_list("pk", flat=True)
    ) == {r.pk for r in rows}
    other.refresh_from_db()
    assert other.dead_lettered_at is not None


def test_triage_from_the_detail_page() -> None:
    row = dead_letter()
    client = staff("view_notificationentity", "discard_notificationentity")
    url = reverse("admin:notifications_retry_notificationentity_triage", args=[row.pk, "discard"])
    page = client.get(url)
    assert page.status_code == 200 and page.context["eligible"] == 1
    done = client.post(url, {"reason": "duplicate", "confirm": "yes"})
    assert done.status_code == 302
    row.refresh_from_db()
    assert row.resolution == "discarded"
    assert (
        client.get(
            reverse("admin:notifications_retry_notificationentity_triage", args=[uuid.uuid4(), "discard"])
        ).status_code
        == 404
    )
