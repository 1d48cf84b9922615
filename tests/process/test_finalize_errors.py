"""Scenario 8: database errors injected at finalize: status and event are both written or neither."""

from __future__ import annotations

import random
import time

import pytest
from django.db import connection

from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from tests.factories import NotificationFactory
from tests.process.helpers import assert_one_event_per_final_outcome, db_now

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Status = NotificationEntity.Status

# Fails the UPDATE that writes an outcome (the claim token cleared, or, for a record delivered inside
# its claim, the status changed) of chosen rows with the SQLSTATE in the recipient, or terminates the
# session for 'lost'.
INJECT = """
CREATE FUNCTION nr_test_inject() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF ((OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL) OR NEW.status <> OLD.status)
       AND NEW.recipient LIKE 'inject-%' THEN
        IF NEW.recipient = 'inject-lost' THEN
            PERFORM pg_terminate_backend(pg_backend_pid());
            PERFORM pg_sleep(5);
        END IF;
        RAISE EXCEPTION 'injected failure for %', NEW.id USING ERRCODE = substr(NEW.recipient, 8, 5);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER nr_test_inject BEFORE UPDATE ON notifications_retry_notificationentity
    FOR EACH ROW EXECUTE FUNCTION nr_test_inject();
"""
UNINJECT = (
    "DROP TRIGGER IF EXISTS nr_test_inject ON notifications_retry_notificationentity; "
    "DROP FUNCTION IF EXISTS nr_test_inject();"
)

ERRORS = {
    "serialization_failure": "40001",
    "deadlock_detected": "40P01",
    "statement_timeout": "57014",
    "trigger_violation": "23514",
    "lost_connection": "lost",
}


# in_app delivers inside the claim transaction; a stub that waits goes through lease and finalize.
PROVIDERS = {"inline": ("in_app", {}), "leased": ("stub", {"delay_seconds": 0.001})}


@pytest.mark.parametrize("provider", list(PROVIDERS))
@pytest.mark.parametrize("sqlstate", list(ERRORS.values()), ids=list(ERRORS))
def test_finalize_error_writes_status_and_event_together_or_neither(sqlstate, provider, settings):
    settings.NOTIFICATIONS_RETRY = {"LEASE_GRACE_SECONDS": 0.2}
    provider_key, options = PROVIDERS[provider]
    channel = ChannelConfig.objects.create(
        key="ch", provider_key=provider_key, options=options, timeout_seconds=0.5, max_attempts=5
    )
    due = db_now()
    poison = [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=due,
            recipient=f"inject-{sqlstate}",
        )
        for _ in range(3)
    ]
    healthy = [
        NotificationFactory(channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=due)
        for _ in range(20)
    ]
    with connection.cursor() as cursor:
        cursor.execute(INJECT)
    worker = Worker(rng=random.Random(1))
    try:
        stats = worker.tick()
        connection.close()  # the 'lost' case killed the connection this process shares with the worker
        assert stats.sent == 20
        assert stats.finalize_failed == 3
        sent = NotificationEntity.objects.filter(pk__in=[r.pk for r in healthy], status=Status.SENT)
        assert sent.count() == 20
        stuck = NotificationEntity.objects.filter(pk__in=[r.pk for r in poison])
        assert set(stuck.values_list("status", "attempts")) == {(Status.FAILED, 2)}
        assert stuck.filter(claim_token__isnull=False).count() == 3, "left leased for a later retry"
        assert not Outbox.objects.filter(key__in=[str(r.pk) for r in poison]).exists()
        assert_one_event_per_final_outcome()
        with connection.cursor() as cursor:
            cursor.execute(UNINJECT)
        # The lease runs out; the next tick finishes them, each with its one event.
        latest = max(stuck.values_list("claim_expires_at", flat=True))
        while db_now() <= latest:
            time.sleep(0.05)
        assert worker.tick().sent == 3
        assert NotificationEntity.objects.filter(status=Status.SENT).count() == 23
        assert Outbox.objects.count() == 23
        assert_one_event_per_final_outcome()
    finally:
        worker.close()
        with connection.cursor() as cursor:
            cursor.execute(UNINJECT)
