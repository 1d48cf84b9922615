"""Which rows may be requeued or discarded: the QuerySet's rule, shown by the admin, kept by the service."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from notifications_retry import api
from notifications_retry.delivery import triage
from notifications_retry.models import NotificationEntity
from tests.factories import NotificationFactory
from tests.support.admin_pages import action, dead_letter, staff

pytestmark = pytest.mark.django_db

TRIAGE = "admin:notifications_retry_notificationentity_triage"
CHANGE = "admin:notifications_retry_notificationentity_change"


def withdrawn_dead_letters() -> dict[str, NotificationEntity]:
    """A requeueable dead letter beside the ones a requeue must never touch."""
    now = timezone.now()
    cancelled = api.cancel_notification(NotificationFactory(), actor="shop", reason="order void")
    return {
        "requeueable": dead_letter(),
        "cancelled": cancelled,
        # cancelled but not resolved (as an older release left them): the error kind alone refuses it
        "cancelled_unresolved": dead_letter(error_kind="cancelled", last_error="cancelled by shop"),
        "expired": dead_letter(error_kind="expired", expires_at=now - timedelta(minutes=1)),
    }


def test_queryset_rules() -> None:
    rows = withdrawn_dead_letters()
    alive = NotificationFactory(status="failed", attempts=1, next_attempt_at=timezone.now())
    now = timezone.now()
    requeueable = set(NotificationEntity.objects.requeueable(now).values_list("pk", flat=True))
    assert requeueable == {rows["requeueable"].pk}
    discardable = set(NotificationEntity.objects.discardable().values_list("pk", flat=True))
    assert discardable == {rows["requeueable"].pk, rows["cancelled_unresolved"].pk, rows["expired"].pk}
    assert alive.pk not in requeueable | discardable
    # a deadline still ahead does not block a requeue
    later = dead_letter(expires_at=now + timedelta(hours=1))
    assert NotificationEntity.objects.requeueable(now).filter(pk=later.pk).exists()


def test_confirmation_never_counts_a_cancelled_or_expired_dead_letter() -> None:
    rows = withdrawn_dead_letters()
    client = staff("view_notificationentity", "requeue_notificationentity")
    confirm = action(client, "requeue_selected", [r.pk for r in rows.values()])
    assert confirm.status_code == 200
    assert (confirm.context["total"], confirm.context["eligible"], confirm.context["refused"]) == (4, 1, 3)
    assert 'value="Yes, requeue 1"' in confirm.content.decode()


def test_service_refuses_exactly_what_the_confirmation_left_out() -> None:
    rows = withdrawn_dead_letters()
    client = staff("view_notificationentity", "requeue_notificationentity")
    done = action(client, "requeue_selected", [r.pk for r in rows.values()], confirm="yes", reason="retry")
    assert done.status_code == 302
    messages = [str(m) for m in client.get(done["Location"]).context["messages"]]
    assert "Requeued 1 notification(s)." in messages
    assert any("Refused 3" in m and "cancelled by the application" in m and "deadline" in m for m in messages)
    for name in ("cancelled", "cancelled_unresolved", "expired"):
        row = rows[name]
        row.refresh_from_db()
        assert row.dead_lettered_at is not None and row.requeue_count == 0, name
    # called directly, the service gives the same answer
    direct = triage.requeue([rows["expired"].pk, rows["cancelled"].pk], actor="x")
    assert direct.done == [] and set(direct.refused) == {rows["expired"].pk, rows["cancelled"].pk}


def test_detail_page_offers_requeue_only_when_the_rule_allows() -> None:
    rows = withdrawn_dead_letters()
    client = staff("view_notificationentity", "requeue_notificationentity", "discard_notificationentity")
    for name, requeue, discard in [
        ("requeueable", True, True),
        ("cancelled", False, False),  # cancelled is discarded at once
        ("cancelled_unresolved", False, True),
        ("expired", False, True),
    ]:
        row = rows[name]
        page = client.get(reverse(CHANGE, args=[row.pk]))
        assert page.status_code == 200, name
        html = page.content.decode()
        assert (reverse(TRIAGE, args=[row.pk, "requeue"]) in html) is requeue, name
        assert (reverse(TRIAGE, args=[row.pk, "discard"]) in html) is discard, name
    confirm = client.get(reverse(TRIAGE, args=[rows["expired"].pk, "requeue"]))
    assert confirm.status_code == 200 and confirm.context["eligible"] == 0
    assert "disabled" in confirm.content.decode()
