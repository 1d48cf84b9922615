"""The admin's triage actions on a real PostgreSQL: requeue and discard, from the list and the detail
page, with a reason, the audit, the refusals and the cap on "all matching"."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from notifications_retry.admin import triage_actions
from notifications_retry.models import DeadLetterAction, NotificationEntity
from tests.factories import NotificationFactory
from tests.support.admin_pages import action, dead_letter, staff

pytestmark = pytest.mark.django_db


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


def test_apply_to_all_matching_the_filter_shows_count_and_respects_the_cap(monkeypatch: Any) -> None:
    rows = [dead_letter(error_kind="http_4xx") for _ in range(3)]
    other = dead_letter(error_kind="timeout")
    client = staff("view_notificationentity", "requeue_notificationentity")
    query = "?dead_letter=unresolved&error_kind=http_4xx"
    confirm = action(client, "requeue_selected", [rows[0].pk], query, select_across="1")
    assert confirm.status_code == 200
    assert confirm.context["total"] == 3 and confirm.context["across"]
    assert "match the current filter" in confirm.content.decode()

    monkeypatch.setattr(triage_actions, "BULK_ACTION_CAP", 2)
    capped = action(
        client, "requeue_selected", [rows[0].pk], query, select_across="1", confirm="yes", reason="x"
    )
    assert capped.status_code == 302
    messages = [str(m) for m in client.get(capped["Location"]).context["messages"]]
    assert any("cap for one action is 2" in m for m in messages)
    assert NotificationEntity.objects.filter(dead_lettered_at__isnull=True).count() == 0

    monkeypatch.setattr(triage_actions, "BULK_ACTION_CAP", 3)
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
