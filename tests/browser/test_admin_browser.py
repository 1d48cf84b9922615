"""The triage flow in a real browser: log in, dashboard, filter dead letters, requeue, check the database."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from notifications_retry.delivery.events import dispatched_event
from notifications_retry.models import BacklogSample, DeadLetterAction, NotificationEntity, WorkerHeartbeat
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"


def seed() -> dict[str, Any]:
    """A small, realistic queue: dead letters of two kinds, a retry backlog, sent rows, 24 h of samples."""
    now = timezone.now()
    email = ChannelFactory(key="email", provider_key="stub", max_attempts=5, options={})
    webhook = ChannelFactory(
        key="webhook",
        provider_key="webhook",
        max_attempts=3,
        options={"url": "https://hooks.example.com/notify", "secret": "s3cr3t"},
    )
    tenant = uuid.UUID("7d1f3c2a-0000-4000-8000-00000000a11c")
    dead = []
    for i, (channel, kind, error) in enumerate(
        [
            (webhook, "http_4xx", "webhook answered HTTP 410: endpoint gone"),
            (email, "invalid_address", "mailbox does not exist"),
            (webhook, "http_5xx", "webhook answered HTTP 503 (3 attempts)"),
        ]
    ):
        dead.append(
            NotificationFactory(
                channel=channel,
                tenant_id=tenant if i != 1 else None,
                status="failed",
                attempts=channel.max_attempts,
                error_kind=kind,
                last_error=error,
                recipient=["ops@acme.example", "jane.doe@example.com", "+15551234567"][i],
                payload={"template": "order_shipped", "order": 4200 + i, "lines": [{"sku": "A-1", "qty": 2}]},
                dead_lettered_at=now - timedelta(minutes=30 * (i + 1)),
                dead_letter_reason=f"terminal: {kind}",
                created_at=now - timedelta(hours=2 + i),
                attempt_log=[
                    {
                        "at": (now - timedelta(minutes=90 - 20 * n)).isoformat(),
                        "attempt": n,
                        "outcome": "retry" if n < channel.max_attempts else "failed",
                        "error_kind": kind,
                        "error": error,
                    }
                    for n in range(1, channel.max_attempts + 1)
                ],
            )
        )
    for row in dead:
        dispatched_event(
            generation=0,
            created_at=row.dead_lettered_at,
            notification_id=row.pk,
            tenant_id=row.tenant_id,
            channel=row.channel.key,
            status="Failed",
            attempts=row.attempts,
            provider_message_id=None,
            error=row.last_error,
            error_kind=row.error_kind,
        ).save()
    for i in range(4):
        NotificationFactory(
            channel=email,
            status="failed",
            attempts=1,
            error_kind="timeout",
            last_error="provider timed out",
            next_attempt_at=now - timedelta(minutes=i),
        )
    for _ in range(6):
        NotificationFactory(channel=email, status="sent", provider_message_id=f"pm-{uuid.uuid4().hex[:10]}")
    BacklogSample.objects.bulk_create(
        BacklogSample(
            taken_at=now - timedelta(minutes=24 * 60 - i),
            due_backlog=max(0, 40 - abs(i - 600) // 10) + 4,
            failed_backlog=max(0, 40 - abs(i - 600) // 10) // 2 + 4,
            dead_letters_unresolved=3 if i > 1200 else 1,
        )
        for i in range(0, 24 * 60, 15)
    )
    # A channel that cannot send (a webhook without its URL): the channel list must show it at a glance.
    ChannelFactory(key="partner_hook", provider_key="webhook", max_attempts=3, options={})
    WorkerHeartbeat.objects.create(lane="default", hostname="worker-1", pid=4242, last_tick_completed_at=now)
    User.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    return {"dead": dead}


def login(page: Any, base: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


def test_triage_flow_dashboard_filter_requeue(live_server: Any, page: Any, screenshot_dir: Path) -> None:
    data = seed()
    base = live_server.url
    assert base.startswith("http://127.0.0.1:")
    login(page, base)

    page.goto(f"{base}/admin/notifications_retry/notificationentity/dashboard/")
    assert page.locator("h1").inner_text() == "Queue health"
    assert page.locator("#nr-card-dead .nr-card-value").inner_text() == "3"
    assert page.locator("#nr-card-due .nr-card-value").inner_text() == "4"
    assert page.locator("svg.nr-chart polyline").count() == 3
    page.screenshot(path=str(screenshot_dir / "admin-dashboard.png"), full_page=True)

    # From the dashboard into the list filtered to unresolved dead letters.
    page.click("#nr-card-dead")
    page.wait_for_url(re.compile(r"dead_letter=unresolved"))
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    assert "jane.doe@example.com" not in page.content()  # masked in lists
    page.screenshot(path=str(screenshot_dir / "admin-list.png"), full_page=True)

    target: NotificationEntity = data["dead"][0]
    page.click(f"#result_list a[href*='{target.pk}']")
    page.wait_for_url(re.compile(str(target.pk)))
    assert "endpoint gone" in page.locator(".field-last_error_display").inner_text()
    assert page.title().startswith(f"Dead letter: {target.pk} on webhook |")  # as its badge says
    assert page.locator(".field-status_badge .nr-badge").inner_text() == "dead letter"
    assert "order_shipped" in page.locator(".field-payload_display").inner_text()
    page.screenshot(path=str(screenshot_dir / "admin-detail.png"), full_page=True)
    page.go_back()

    # Requeue one with the action: select it, choose the action, confirm with a reason.
    page.check(f"input[name=_selected_action][value='{target.pk}']")
    page.select_option("select[name=action]", "requeue_selected")
    page.click("button[name=index]")
    assert page.locator("#nr-total").inner_text() == "1"
    page.fill("textarea[name=reason]", "endpoint restored by the partner")
    page.click("input[name=_confirm]")
    page.wait_for_selector(".messagelist")
    assert "Requeued 1 notification(s)." in page.locator(".messagelist").inner_text()
    assert page.locator("#result_list tbody tr").count() == 2

    target.refresh_from_db()
    assert target.dead_lettered_at is None and target.attempts == 0 and target.requeue_count == 1
    audit = DeadLetterAction.objects.get(notification=target)
    assert (audit.action, audit.actor, audit.reason) == (
        "requeue",
        "operator",
        "endpoint restored by the partner",
    )
    others = NotificationEntity.objects.filter(pk__in=[r.pk for r in data["dead"][1:]])
    assert all(r.dead_lettered_at is not None for r in others)


def test_discard_everything_matching_the_filter(live_server: Any, page: Any) -> None:
    data = seed()
    webhook = data["dead"][0].channel
    now = timezone.now()
    # More rows than a page (50): "Select all" then reaches the rows not shown.
    NotificationEntity.objects.bulk_create(
        NotificationEntity(
            channel=webhook,
            recipient=f"hook-{i}@example.com",
            status="failed",
            attempts=3,
            error_kind="http_4xx",
            last_error="webhook answered HTTP 410",
            dead_lettered_at=now - timedelta(minutes=i),
            created_at=now - timedelta(hours=3, minutes=i),
        )
        for i in range(52)
    )
    base = live_server.url
    login(page, base)
    page.goto(
        f"{base}/admin/notifications_retry/notificationentity/?dead_letter=unresolved&error_kind=http_4xx"
    )
    assert page.locator("#result_list tbody tr").count() == 50
    page.check("#action-toggle")
    page.click(".actions .question a")  # "Select all 53 notifications": everything matching the filter
    page.select_option("select[name=action]", "discard_selected")
    page.click("button[name=index]")
    assert page.locator("#nr-total").inner_text() == "53"
    assert "match the current filter" in page.locator(".nr-count").inner_text()
    page.fill("textarea[name=reason]", "partner endpoint retired")
    page.click("input[name=_confirm]")
    page.wait_for_selector(".messagelist")
    assert "Discarded 53 notification(s)." in page.locator(".messagelist").inner_text()
    matching = NotificationEntity.objects.filter(error_kind="http_4xx", dead_lettered_at__isnull=False)
    assert matching.count() == 53 and set(matching.values_list("resolution", flat=True)) == {"discarded"}
    untouched = NotificationEntity.objects.filter(pk__in=[r.pk for r in data["dead"][1:]])
    assert set(untouched.values_list("resolution", flat=True)) == {""}
