"""Scenario 10: an application clock skewed by +-10 minutes changes nothing (the database's clock rules)."""

from __future__ import annotations

import pytest
from django.db import connection

from notifications_retry.models import ChannelConfig, NotificationEntity
from tests.process.conftest import seed_due
from tests.support.processes import REPO_ROOT

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SKEWED_PATH = str(REPO_ROOT / "tests" / "support" / "skewed_clock")


def scenario(start_worker, skew: int, clock: str) -> dict[str, tuple[int, str]]:
    channel = ChannelConfig.objects.create(key="in_app", provider_key="in_app", timeout_seconds=1.0)
    seed_due(channel, 5)  # due a minute ago
    seed_due(channel, 5)
    with connection.cursor() as cursor:
        # Five rows due in 5 minutes, and five leased by a live worker for 5 more minutes.
        cursor.execute(
            "UPDATE notifications_retry_notificationentity SET next_attempt_at = now() + '5 min' "
            "WHERE id IN (SELECT id FROM notifications_retry_notificationentity "
            "ORDER BY due_at DESC LIMIT 5)"
        )
        cursor.execute(
            "UPDATE notifications_retry_notificationentity SET claim_token = gen_random_uuid(), "
            "claim_expires_at = now() + '5 min', attempts = attempts + 1 "
            "WHERE id IN (SELECT id FROM notifications_retry_notificationentity "
            "WHERE next_attempt_at < now() ORDER BY due_at DESC LIMIT 5)"
        )
    seed_due(channel, 5)
    env = {"PYTHONPATH": SKEWED_PATH + ":" + str(REPO_ROOT), "NR_TEST_CLOCK_SKEW": str(skew)}
    worker = start_worker(["--once"], {"CLOCK": clock}, env=env)
    assert worker.wait(60) == 0, worker.output()
    rows = NotificationEntity.objects.values_list("status", "claim_token", "next_attempt_at")
    return {
        "sent": sum(1 for status, _, _ in rows if status == "sent"),
        "leased_untouched": sum(1 for status, token, _ in rows if token is not None and status == "failed"),
    }


@pytest.mark.parametrize("skew", [600, -600], ids=["ahead-10min", "behind-10min"])
def test_skewed_application_clock_changes_nothing_with_the_database_clock(start_worker, skew):
    assert scenario(start_worker, skew, "database") == {"sent": 5, "leased_untouched": 5}


def test_the_skew_is_real_a_system_clock_10min_ahead_would_send_early_and_steal_leases(start_worker):
    # Guard: the same worker on its own (skewed) clock sends rows not yet due and takes live leases.
    assert scenario(start_worker, 600, "system") == {"sent": 15, "leased_untouched": 0}
