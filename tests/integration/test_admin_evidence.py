"""The admin's attempt timeline and the dead-letter filters by last answer and error kind."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.admin.filters import status_class
from notifications_retry.models import NotificationEntity
from tests.support.admin_pages import (  # noqa: F401  (admin_user is a fixture)
    CHANGELIST,
    admin_user,
    dead_letter,
    ids_in,
)

pytestmark = pytest.mark.django_db


def entry(attempt: int, outcome: str, code: int | None, **fields: Any) -> dict[str, Any]:
    at = timezone.now() - timedelta(minutes=30 - attempt)
    values: dict[str, Any] = {
        "attempt": attempt,
        "at": at.isoformat(),
        "outcome": outcome,
        "generation": 0,
        "duration_ms": 120.4,
        "status_code": code,
        "response_excerpt": "",
        "remote_addr": "203.0.113.7" if code is not None else None,
        "trigger": "scheduled",
    }
    values.update(fields)
    return values


def answered(code: int | None, kind: str) -> NotificationEntity:
    """A dead letter whose last attempt got ``code`` (None: no answer)."""
    log = [entry(1, "retry", 503, error_kind="http_5xx"), entry(2, "terminal", code, error_kind=kind)]
    return dead_letter(error_kind=kind, attempt_log=log)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(200, "2xx"), (250, "2xx"), (302, "3xx"), (410, "4xx"), (550, "5xx"), (None, "none")],
)
def test_status_classes(value: int | None, expected: str) -> None:
    assert status_class(value) == expected
    assert status_class(True) == "none" and status_class("401") == "none"


def test_dead_letters_filter_by_the_last_answers_class_and_error_kind(admin_client: Client) -> None:
    unauthorized = answered(401, "http_4xx")
    gone = answered(410, "http_4xx")
    down = answered(502, "http_5xx")
    timed_out = answered(None, "timeout")
    never_called = dead_letter(error_kind="expired", attempt_log=[{"attempt": 1, "outcome": "terminal"}])
    url = reverse(CHANGELIST)
    assert ids_in(admin_client.get(url, {"dead_letter": "yes", "answer": "4xx"})) == {
        str(unauthorized.pk),
        str(gone.pk),
    }
    assert ids_in(admin_client.get(url, {"dead_letter": "yes", "answer": "5xx"})) == {str(down.pk)}
    assert ids_in(admin_client.get(url, {"answer": "none"})) == {str(timed_out.pk), str(never_called.pk)}
    assert ids_in(admin_client.get(url, {"answer": "2xx"})) == set()
    both = admin_client.get(url, {"answer": "none", "error_kind": "timeout"})
    assert ids_in(both) == {str(timed_out.pk)}
    page = admin_client.get(url).content.decode()
    assert "By last answer" in page and "no answer" in page
    assert ids_in(admin_client.get(url, {"answer": "bogus"})) == {
        str(r.pk) for r in (unauthorized, gone, down, timed_out, never_called)
    }


def test_the_notification_page_shows_the_attempt_timeline(admin_client: Client) -> None:
    log = [
        entry(1, "retry", None, error_kind="timeout", error="no complete answer within 10s"),
        entry(2, "terminal", 401, error_kind="http_4xx", response_excerpt='{"error": "bad <token>"}'),
        entry(1, "sent", 200, generation=1, trigger="manual"),
    ]
    row = dead_letter(attempt_log=log, requeue_count=1)
    page = admin_client.get(
        reverse("admin:notifications_retry_notificationentity_change", args=[row.pk])
    ).content.decode()
    timeline = page[page.index('class="nr-timeline"') :]
    assert timeline.index("no answer") < timeline.index(">401<") < timeline.index(">200<")
    assert "nr-code-4xx" in timeline and "nr-code-none" in timeline and "nr-code-2xx" in timeline
    assert "requeued: run 1" in timeline and ">manual<" in timeline and ">scheduled<" in timeline
    assert "120 ms" in timeline and "from 203.0.113.7" in timeline
    assert "&lt;token&gt;" in timeline and "<token>" not in timeline  # the excerpt is escaped


def test_an_entry_from_before_the_evidence_fields_still_shows(admin_client: Client) -> None:
    row = dead_letter()  # the factory's entries carry no status_code, trigger or duration
    page = admin_client.get(
        reverse("admin:notifications_retry_notificationentity_change", args=[row.pk])
    ).content.decode()
    assert "no answer recorded" in page and "timed out" in page
