"""The attempt timeline and the dead-letter filters by last answer, in Chromium at 1,440 px."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from notifications_retry.models import NotificationEntity
from tests.browser.test_admin_browser import PASSWORD, login
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def attempt(n: int, minutes_ago: int, outcome: str, code: int | None, **fields: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "attempt": n,
        "at": (timezone.now() - timedelta(minutes=minutes_ago)).isoformat(timespec="seconds"),
        "outcome": outcome,
        "generation": 0,
        "duration_ms": 84.0 if code is not None else 10000.0,
        "status_code": code,
        "response_excerpt": "",
        "remote_addr": "203.0.113.7" if code is not None else None,
        "trigger": "scheduled",
    }
    values.update(fields)
    return values


def seed() -> NotificationEntity:
    """Dead letters that ended four ways; the first one's history is the timeline's subject."""
    now = timezone.now()
    hooks = ChannelFactory(key="partner_hook", provider_key="webhook", max_attempts=4, options={})
    ledger = ChannelFactory(key="ledger_hook", provider_key="webhook", max_attempts=3, options={})
    ends = [
        (401, "http_4xx", '{"error": "invalid_signature", "detail": "no v1 signature matched"}'),
        (410, "http_4xx", '{"error": "gone", "detail": "endpoint removed"}'),
        (503, "http_5xx", "<html><body>503 Service Unavailable</body></html>"),
        (None, "timeout", ""),
    ]
    rows = []
    for i, (code, kind, body) in enumerate(ends):
        log = [
            attempt(
                1,
                200,
                "retry",
                None,
                error_kind="timeout",
                error="webhook timeout failure: no complete answer within 10s",
            ),
            attempt(
                2,
                190,
                "retry",
                503,
                error_kind="http_5xx",
                error="webhook answered HTTP 503",
                response_excerpt="upstream unavailable, retry later",
            ),
            attempt(
                3,
                150,
                "terminal",
                code,
                error_kind=kind,
                error=f"webhook answered HTTP {code}" if code else "webhook timeout failure",
                response_excerpt=body,
            ),
        ]
        if i == 0:
            log += [
                attempt(
                    1,
                    40,
                    "retry",
                    502,
                    generation=1,
                    trigger="manual",
                    error_kind="http_5xx",
                    error="webhook answered HTTP 502",
                    response_excerpt="<html><body>502 Bad Gateway</body></html>",
                ),
                attempt(
                    2,
                    20,
                    "terminal",
                    401,
                    generation=1,
                    error_kind="http_4xx",
                    error="webhook answered HTTP 401",
                    response_excerpt=body,
                ),
            ]
        rows.append(
            NotificationFactory(
                channel=hooks if i != 2 else ledger,
                status="failed",
                attempts=len(log) if i else 2,
                requeue_count=1 if i == 0 else 0,
                error_kind=kind,
                last_error=log[-1]["error"],
                recipient="ops@acme.example",
                payload={"event": "invoice.paid", "invoice": 4200 + i},
                dead_lettered_at=now - timedelta(minutes=20 + 30 * i),
                dead_letter_reason=f"{kind}: {log[-1]['error']}",
                created_at=now - timedelta(hours=4),
                attempt_log=log,
            )
        )
    User.objects.create_superuser("operator", "operator@example.com", PASSWORD)
    return rows[0]


def test_dead_letters_by_last_answer_and_the_attempt_timeline(
    live_server: Any, page: Any, screenshot_dir: Path
) -> None:
    target = seed()
    base = live_server.url
    login(page, base)

    page.goto(f"{base}/admin/notifications_retry/notificationentity/?dead_letter=unresolved&answer=4xx")
    assert page.locator("#result_list tbody tr").count() == 2
    assert page.locator("#changelist-filter").inner_text().count("no answer") == 1
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440
    page.screenshot(path=str(screenshot_dir / "admin-dead-letter-filters.png"), full_page=True)

    page.click(f"#result_list a[href*='{target.pk}']")
    page.wait_for_url(re.compile(str(target.pk)))
    items = page.locator(".nr-timeline .nr-tl-item")
    assert items.count() == 5
    assert items.nth(0).locator(".nr-code").inner_text() == "no answer"
    assert items.nth(4).locator(".nr-code").inner_text() == "401"
    assert "manual" in items.nth(3).inner_text() and "invalid_signature" in items.nth(4).inner_text()
    assert page.locator(".nr-tl-run").inner_text() == "requeued: run 1"
    assert page.evaluate("document.documentElement.scrollWidth") <= 1440
    page.locator(".nr-timeline").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "admin-attempt-timeline.png"), full_page=True)
