"""Scenarios 1 and 2: kill -9 at random points mid-batch, and a graceful SIGTERM, on real processes."""

from __future__ import annotations

import json
import random
import signal
import time

import pytest

from notifications_retry.models import NotificationEntity
from tests.process.conftest import seed_due
from tests.process.helpers import (
    assert_one_event_per_final_outcome,
    claimed_ids,
    db_now,
    lock_holders,
    requests_by_key,
    webhook_channel,
)
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SENT = NotificationEntity.Status.SENT
LOOP = ["--interval", "0.1", "--batch-size", "100000", "--max-duration", "60"]
SETTINGS = {"LEASE_GRACE_SECONDS": 0.3, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}


def test_kill_9_mid_batch_loses_nothing_and_resends_only_in_flight_with_same_key(start_worker):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    server = ScriptedServer(
        lambda request: Reply(200, {"id": "m-" + request.headers["idempotency-key"]}, delay=0.03)
    ).start()
    try:
        channel = webhook_channel(server.url, max_attempts=6, timeout_seconds=1.0, max_concurrency=8)
        total = 600
        seed_due(channel, total)
        in_flight_at_kills = 0
        lock_free_after = []
        for _ in range(3):
            before = len(server.requests)
            worker = start_worker(LOOP, SETTINGS, name="victim")
            wait_until(lambda before=before: len(server.requests) > before, 30, message="a first call")
            time.sleep(rng.uniform(0.05, 0.6))
            # Killed while it holds the cycle's lock: a looping worker whose claim came back short (rows
            # still locked by the last victim's dying transaction) may be between two ticks, 0.1 s apart.
            held = f"the worker holds the cycle lock (seed {seed})"
            wait_until(lambda: bool(lock_holders()), 5, 0.005, held)
            worker.kill()
            lock_free_after.append(wait_until(lambda: not lock_holders(), 5, 0.01, "advisory lock released"))
            in_flight_at_kills += len(claimed_ids())
        assert max(lock_free_after) < 1.0, lock_free_after
        assert in_flight_at_kills > 0
        stranded = claimed_ids()
        # The dead workers' leases run out; the next tick takes those records again.
        latest = (
            NotificationEntity.objects.exclude(claim_expires_at=None).order_by("-claim_expires_at").first()
        )
        if latest is not None:
            wait_until(lambda: db_now() > latest.claim_expires_at, 10, message="leases expired")
        final = start_worker(
            ["--once", "--batch-size", "100000", "--max-duration", "60"], SETTINGS, name="final"
        )
        assert final.wait(60) == 0, final.output()
        assert not claimed_ids()
        assert NotificationEntity.objects.filter(pk__in=stranded, status=SENT).count() == len(stranded)
        assert NotificationEntity.objects.filter(status=SENT).count() == total, f"seed {seed}"
        assert_one_event_per_final_outcome()
        by_key = requests_by_key(server.requests)
        assert len(by_key) == total
        extra = len(server.requests) - total
        assert extra <= in_flight_at_kills, (extra, in_flight_at_kills, seed)
        for key, requests in by_key.items():
            # A kill can cut a request off after its headers: only complete bodies are compared.
            bodies = {r.body for r in requests if len(r.body) == int(r.headers.get("content-length", -1))}
            assert len(bodies) == 1, f"resent body differs for {key}"
            assert json.loads(bodies.pop())["notification_id"] == key
    finally:
        server.stop()


def test_sigterm_mid_batch_claims_nothing_more_finalizes_in_flight_and_exits_0(start_worker):
    server = ScriptedServer(lambda request: Reply(200, {"id": "ok"}, delay=1.0)).start()
    try:
        timeout = 2.0
        channel = webhook_channel(server.url, timeout_seconds=timeout, max_concurrency=4)
        seed_due(channel, 40)
        worker = start_worker(LOOP, SETTINGS)
        wait_until(lambda: len(server.requests) >= 4, 30, message="four calls in flight")
        time.sleep(0.2)
        worker.send(signal.SIGTERM)
        signalled = time.monotonic()
        status = worker.wait(timeout + 5)
        elapsed = time.monotonic() - signalled
        assert status == 0, worker.output()
        assert elapsed <= timeout + 2, elapsed
        late = [r for r in server.requests if r.received_at > signalled + 0.05]
        assert not late, "a send started after SIGTERM"
        assert not claimed_ids(), "records in hand were left claimed"
        rows = list(NotificationEntity.objects.values_list("attempts", "status"))
        # Every counted attempt is a call that happened: nothing was claimed and left unsent.
        assert sum(attempts - 1 for attempts, _ in rows) == len(server.requests)
        assert sum(1 for _, status in rows if status == SENT) == len(server.requests)
        assert_one_event_per_final_outcome()
    finally:
        server.stop()
