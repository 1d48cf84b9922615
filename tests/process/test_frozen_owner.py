"""An owner that lost its lock starts nothing: a worker frozen (SIGSTOP) until the server ended its lock
session, whose rows a standby took over and sent, starts no provider call once continued (SIGCONT); the
answers that reached it while it was frozen are read, not called timeouts, and discarded under their
claim token. The server ends the frozen session as its ``idle_session_timeout`` would (90 s,
``locks.LOCK_IDLE_SESSION_TIMEOUT_SECONDS``; tests/integration/test_claims.py shows that timeout end a
session), but at once, and the leases are shortened, so that it runs in seconds."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from notifications_retry.models import NotificationEntity
from tests.process.conftest import seed_due
from tests.process.helpers import assert_one_event_per_final_outcome, db_now, lock_holders, webhook_channel
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SETTINGS = {
    "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    "LEASE_GRACE_SECONDS": 0.5,
    "CIRCUIT_BREAKER": {"failure_threshold": 1000},
}
ROWS = 40


def terminate(pids: list[int]) -> None:
    assert pids, "the owner holds its lock"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])


def _live_leases() -> bool:
    return NotificationEntity.objects.filter(
        claim_token__isnull=False, claim_expires_at__gt=db_now()
    ).exists()


def test_a_resumed_owner_that_lost_its_lock_starts_no_call(start_worker):
    # Each answer takes 1 s: the owner has 4 calls in flight and a round queued when it is frozen.
    server = ScriptedServer(lambda r: Reply(200, {"id": "m"}, delay=1.0)).start()
    try:
        channel = webhook_channel(server.url, max_concurrency=4, timeout_seconds=2.0, max_attempts=5)
        seed_due(channel, ROWS)
        owner = start_worker(["--interval", "0.2", "--batch-size", "40", "--max-duration", "60"], SETTINGS)
        wait_until(lambda: len(server.requests) >= 4, 60, 0.01, "the owner's calls in flight")
        owner.send(signal.SIGSTOP)
        # The server ends the frozen owner's lock session, as its idle timeout would; its leases run
        # out after theirs, waited for, not slept through.
        terminate(lock_holders())
        wait_until(lambda: not lock_holders(), 30, 0.1, "the frozen owner's lock freed by the server")
        wait_until(lambda: not _live_leases(), 30, 0.1, "the frozen owner's leases run out")
        standby = start_worker(
            ["--once", "--batch-size", "40", "--max-duration", "60"], SETTINGS, name="standby"
        )
        assert standby.wait(90) == 0, standby.output()[-3000:]
        assert NotificationEntity.objects.filter(channel=channel, status="sent").count() == ROWS
        before_resume = len(server.requests)
        owner.send(signal.SIGCONT)
        wait_until(
            lambda: "retry-cycle-lock-lost" in owner.output(), 30, 0.05, "the owner sees its lock lost"
        )
        owner.send(signal.SIGTERM)
        assert owner.wait(30) == 0, owner.output()[-3000:]
        after_resume = len(server.requests) - before_resume
    finally:
        server.stop()
    output = owner.output()
    assert after_resume == 0, output[-3000:]
    # What came back while it was frozen was an answer, not a timeout; its claim was taken over.
    stale = [line for line in output.splitlines() if "item-stale" in line]
    assert stale and all("outcome=sent" in line for line in stale), output[-3000:]
    assert "error_kind=timeout" not in output, output[-3000:]
    rows = NotificationEntity.objects.filter(channel=channel)
    assert rows.filter(status="sent").count() == ROWS and not rows.filter(claim_token__isnull=False).exists()
    assert_one_event_per_final_outcome()
