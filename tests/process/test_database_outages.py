"""Scenario 4: the database restarted under a running worker, and its connections terminated.

The restart happens on a private throwaway cluster: the shared server serves other test runs. Each call
takes 0.1 s, so a round of claimed records waits in its channel's queue whenever the fault comes: none
of them may come back with an attempt spent and no call made (docs/guarantees.md, "Only a provider call
spends an attempt"). ``pytest -s`` prints that count for each scenario.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from django.db import connection

from notifications_retry.models import NotificationEntity
from tests.process.conftest import INSERT_DUE, seed_due
from tests.process.helpers import (
    assert_one_event_per_final_outcome,
    lock_holders,
    requests_by_key,
    webhook_channel,
)
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import REPO_ROOT, PrivateCluster, wait_until, worker_env

pytestmark = [pytest.mark.process]

LOOP = ["--interval", "0.1", "--batch-size", "40", "--max-duration", "30"]
SETTINGS = {"LEASE_GRACE_SECONDS": 0.3, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
RESUME_BOUND = 10.0
#: How long the receiver takes to answer: long enough for records to queue behind the calls in flight.
CALL_SECONDS = 0.1
#: The attempts every seeded row starts with (seed_due, INSERT_DUE): none was a call to this receiver.
SEEDED_ATTEMPTS = 1
#: What the worker logs when the database goes away (the tick's handler, the lock, the finalize fallback).
LOGGED_OUTAGE = (
    "retry-cycle-database-error",
    "outcomes-commit-deferred",
    "finalize-fallback",
    "commit-fallback",
    "loop-connection-replaced",
)


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    server = ScriptedServer(lambda r: Reply(200, {"id": "m"}, delay=CALL_SECONDS)).start()
    yield server
    server.stop()


def attempts_without_call(rows: list[tuple[object, int]], server: ScriptedServer, faults: str) -> int:
    """Rows whose attempts counted exceed the calls the receiver got for them (its Idempotency-Key is
    the row's id), printed with ``faults``, what happened to the database."""
    calls = {key: len(requests) for key, requests in requests_by_key(server.requests).items()}
    spent = sum(1 for nid, attempts in rows if attempts - SEEDED_ATTEMPTS > calls.get(str(nid), 0))
    print(f"\nrows with an attempt spent and no call after {faults}: {spent} of {len(rows)}")
    return spent


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    cluster = PrivateCluster().init()
    cluster.start()
    try:
        env = worker_env(cluster.url, "postgres", SETTINGS)
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
            env=env,
            cwd=REPO_ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield cluster
    finally:
        cluster.destroy()


def test_five_postgres_restarts_mid_loop_cost_no_duplicate_send(cluster, server, start_worker):
    with cluster.connect() as db:
        channel_id = db.execute(
            "INSERT INTO notifications_retry_channelconfig (key, is_enabled, provider_key, max_attempts, "
            "retry_backoff, backoff_base_seconds, backoff_cap_seconds, timeout_seconds, max_concurrency, "
            "options, created_at, updated_at) VALUES ('hook', true, 'webhook', 5, 'exponential', 1, 60, 1.0, "
            "4, %s, now(), now()) RETURNING id",
            [f'{{"url": "{server.url}"}}'],
        ).fetchone()[0]
        db.execute(INSERT_DUE, {"channel": channel_id, "count": 400, "attempts": 1})
    worker = start_worker(LOOP, SETTINGS, url=cluster.url, database="postgres")
    resumed: list[float] = []
    for threshold in (40, 100, 160, 220, 280):
        wait_until(lambda threshold=threshold: len(server.requests) >= threshold, 30, message="sending")
        cluster.stop("fast")
        stopped_at = len(server.requests)
        time.sleep(0.5)
        cluster.start()
        back = time.monotonic()
        wait_until(
            lambda back=back: any(r.received_at > back for r in server.requests),
            RESUME_BOUND + 5,
            message="a send after the restart",
        )
        resumed.append(min(r.received_at for r in server.requests if r.received_at > back) - back)
        assert len(server.requests) > stopped_at
    assert max(resumed) <= RESUME_BOUND, resumed

    def all_sent() -> bool:
        with cluster.connect() as db:
            return (
                db.execute(
                    "SELECT count(*) FROM notifications_retry_notificationentity WHERE status = 'sent'"
                ).fetchone()[0]
                == 400
            )

    wait_until(all_sent, 60, 0.2, "all 400 rows sent")
    worker.send(15)
    assert worker.wait(10) == 0
    with cluster.connect() as db:
        events = db.execute("SELECT count(*), count(DISTINCT key) FROM notifications_retry_outbox").fetchone()
        idle_in_tx = db.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%'"
        ).fetchone()[0]
        rows = db.execute("SELECT id, attempts FROM notifications_retry_notificationentity").fetchall()
    assert events == (400, 400)
    assert idle_in_tx == 0
    output = worker.output()
    assert any(logged in output for logged in LOGGED_OUTAGE), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    by_key = requests_by_key(server.requests)
    assert len(by_key) == 400
    # Outcomes in hand when the database went away were kept and committed once it was back.
    duplicates = len(server.requests) - 400
    assert duplicates == 0, (duplicates, resumed)
    # Records claimed but not called when it went away were given back with their attempt.
    assert attempts_without_call(rows, server, "5 PostgreSQL restarts") == 0, output[-3000:]


@pytest.mark.django_db(transaction=True)
def test_five_terminated_connections_mid_tick_cost_no_duplicate_send(server, start_worker):
    channel = webhook_channel(server.url, timeout_seconds=1.0, max_concurrency=4)
    seed_due(channel, 400)
    worker = start_worker(LOOP, SETTINGS)
    for threshold in (40, 100, 160, 220, 280):
        wait_until(lambda threshold=threshold: len(server.requests) >= threshold, 30, message="sending")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            killed = len(cursor.fetchall())
        assert killed >= 2, "the worker's query connection and its lock connection"
        cut = time.monotonic()
        wait_until(
            lambda cut=cut: any(r.received_at > cut for r in server.requests),
            RESUME_BOUND,
            message="a send after the connections were terminated",
        )
        try:
            wait_until(lambda: bool(lock_holders()), RESUME_BOUND, 0.01, "the lock connection is back")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the worker's log:\n{worker.output()[-4000:]}") from None
    wait_until(lambda: NotificationEntity.objects.filter(status="sent").count() == 400, 60, 0.2, "all sent")
    worker.send(15)
    assert worker.wait(10) == 0
    assert any(logged in worker.output() for logged in LOGGED_OUTAGE), worker.output()[-3000:]
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
    assert_one_event_per_final_outcome()
    by_key = requests_by_key(server.requests)
    assert len(by_key) == 400
    assert len(server.requests) - 400 == 0, "no duplicate send: outcomes in hand were committed later"
    rows = list(NotificationEntity.objects.values_list("id", "attempts"))
    spent = attempts_without_call(rows, server, "5 backend terminations")
    assert spent == 0, worker.output()[-3000:]
