"""Suppressions expire when SUPPRESSION_RETENTION_DAYS says so (never by default); housekeeping prunes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from notifications_retry.conf import get_settings, settings_problems
from notifications_retry.delivery import suppression
from notifications_retry.housekeeping import run_housekeeping
from notifications_retry.models import Suppression

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

pytestmark = pytest.mark.django_db


def test_by_default_no_suppression_expires_complaints_included():
    for reason in ("hard_bounce", "complaint", "unsubscribed", "invalid_recipient"):
        row, _ = suppression.record(f"{reason}@example.com", reason=reason, source="Postmark", at=NOW)
        assert row.expires_at is None, reason


def test_a_configured_reason_expires_after_its_last_report_and_complaints_still_never(settings):
    settings.NOTIFICATIONS_RETRY = {"SUPPRESSION_RETENTION_DAYS": {"hard_bounce": 30}}
    bounce, _ = suppression.record("ann@example.com", reason="hard_bounce", source="Postmark", at=NOW)
    assert bounce.expires_at == NOW + timedelta(days=30)
    later = NOW + timedelta(days=10)
    bounce, created = suppression.record("ann@example.com", reason="hard_bounce", source="Postmark", at=later)
    assert (created, bounce.events, bounce.expires_at) == (False, 2, later + timedelta(days=30))
    complaint, _ = suppression.record("bob@example.com", reason="complaint", source="Postmark", at=NOW)
    assert complaint.expires_at is None
    # A complaint on an address whose bounce would expire: it never expires now.
    both, _ = suppression.record("ann@example.com", reason="complaint", source="Postmark", at=later)
    assert (both.reason, both.expires_at) == ("complaint", None)


def test_housekeeping_deletes_expired_suppressions_only(settings, capsys):
    settings.NOTIFICATIONS_RETRY = {"SUPPRESSION_RETENTION_DAYS": {"hard_bounce": 1}}
    suppression.record("old@example.com", reason="hard_bounce", source="smtp", at=NOW - timedelta(days=3))
    fresh, _ = suppression.record("new@example.com", reason="hard_bounce", source="smtp", at=NOW)
    forever, _ = suppression.record(
        "spam@example.com", reason="complaint", source="smtp", at=NOW - timedelta(days=900)
    )
    report = run_housekeeping(now=NOW + timedelta(hours=1))
    assert report.pruned_suppressions == 1
    assert set(Suppression.objects.values_list("pk", flat=True)) == {fresh.pk, forever.pk}
    call_command("notifications_housekeeping")
    assert "deleted 1 expired suppression(s)" in capsys.readouterr().out  # 'new' has expired by now


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"bounce": 3}, "names 'bounce'"),
        ({"hard_bounce": 0}, "from 1 to 36500"),
        ({"hard_bounce": "30"}, "from 1 to 36500"),
        ([("hard_bounce", 3)], "must map suppression reasons"),
    ],
)
def test_bad_retention_settings_are_reported(settings, value, message):
    settings.NOTIFICATIONS_RETRY = {"SUPPRESSION_RETENTION_DAYS": value}
    assert any(message in p for p in settings_problems(get_settings()))
