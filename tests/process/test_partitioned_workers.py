"""PARTITIONS=4 with 1, 2 and 4 real worker processes on one backlog: every row sent once, the work spread
over the workers, and a SIGKILLed worker's partitions taken over (duplicates only of its calls in flight);
a tenant's TENANT_RATE_LIMITS limit is a total over the workers."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction

from notifications_retry.models import ChannelConfig, NotificationEntity
from tests.process.conftest import seed_due
from tests.process.helpers import assert_one_event_per_final_outcome
from tests.support.arrivals import max_in_window
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

PARTITIONS = 4
SETTINGS = {
    "PARTITIONS": PARTITIONS,
    "LEASE_GRACE_SECONDS": 0.5,
    "PROVIDERS": {"slow_recording": "tests.support.fault_providers.SlowRecordingProvider"},
}
LOOP = ["--interval", "0.2", "--batch-size", "1000", "--max-duration", "10"]

# Live workers of the default lane: holders of its presence key (shared advisory locks).
PRESENT = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def call_times(path: Path) -> dict[str, float]:
    """When each notification's first provider call started (the provider's clock, time.time())."""
    times: dict[str, float] = {}
    for line in path.read_text().splitlines():
        _, nid, _, at = line.split()
        times.setdefault(nid, float(at))
    return times


def calls(path: Path) -> list[tuple[int, str]]:
    """(worker pid, notification id) of every provider call, in order."""
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(line.split()[0]), line.split()[1]) for line in lines]


def leases() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id::text, claim_token::text FROM notifications_retry_notificationentity "
            "WHERE claim_token IS NOT NULL"
        )
        return dict(cursor.fetchall())


def slow_channel(call_log: Path, max_concurrency: int) -> ChannelConfig:
    """A channel whose provider answers in 50 ms and logs (worker pid, notification id) per call."""
    return ChannelConfig.objects.create(
        key="hooks",
        provider_key="slow_recording",
        timeout_seconds=1.0,
        max_attempts=5,
        max_concurrency=max_concurrency,
        options={"call_log": str(call_log), "delay": 0.05},
    )


def drain(start_worker, tmp_path: Path, count: int, rows: int, kill_one: bool = False) -> None:
    call_log = tmp_path / "calls.log"
    channel = slow_channel(call_log, max_concurrency=32)
    workers = [start_worker(LOOP, SETTINGS, name=f"w{i}") for i in range(count)]
    # The backlog arrives once every worker is up: each then drains its own partitions.
    wait_until(lambda: _present() == count, 60, message=f"{count} workers present")
    seed_due(channel, rows)
    victim_rows: set[str] = set()
    try:
        if kill_one:
            wait_until(lambda: len(calls(call_log)) > rows // 4, 60, message="a quarter sent")
            by_pid = Counter(pid for pid, _ in calls(call_log))
            victim = next(w for w in workers if by_pid[w.pid])
            victim.send(signal.SIGKILL)
            victim.proc.wait(10)
            at_kill = leases()
            # A survivor's call ends in 50 ms; the victim's leases stay until they run out (2.75 s).
            time.sleep(1.0)
            victim_rows = {nid for nid, token in leases().items() if at_kill.get(nid) == token}
            workers = [w for w in workers if w is not victim]
        wait_until(
            lambda: NotificationEntity.objects.filter(status="sent").count() == rows,
            120,
            0.2,
            "every row sent",
        )
    finally:
        for worker in workers:
            worker.kill()
    made = calls(call_log)
    per_id = Counter(nid for _, nid in made)
    assert len(per_id) == rows
    twice = {nid for nid, n in per_id.items() if n > 1}
    # Only the killed worker's calls in flight (and its queued round) may be sent a second time.
    assert twice <= victim_rows, (len(twice), len(victim_rows))
    assert all(n <= 2 for n in per_id.values())
    per_worker = Counter(pid for pid, _ in made)
    assert len(per_worker) == count, per_worker  # every worker sent some rows
    assert_one_event_per_final_outcome()


def _present() -> int:
    with connection.cursor() as cursor:
        cursor.execute(PRESENT)
        return int(cursor.fetchone()[0])


@pytest.mark.parametrize("count", [1, 2, 4])
def test_workers_share_the_backlog_by_partition_and_send_each_row_once(start_worker, tmp_path, count):
    drain(start_worker, tmp_path, count, rows=1200)


def test_a_killed_workers_partitions_are_taken_over_and_every_row_is_sent(start_worker, tmp_path):
    drain(start_worker, tmp_path, 4, rows=3000, kill_one=True)


def test_a_worker_that_joins_mid_drain_is_given_its_share(start_worker, tmp_path):
    call_log = tmp_path / "calls.log"
    channel = slow_channel(call_log, max_concurrency=8)
    rows = 1500
    first = start_worker(LOOP, SETTINGS, name="first")
    wait_until(lambda: _present() == 1, 60, message="the first worker present")
    seed_due(channel, rows)
    wait_until(lambda: len(calls(call_log)) > 100, 60, message="the first worker sending")
    second = start_worker(LOOP, SETTINGS, name="second")
    try:
        sent = NotificationEntity.objects.filter(status="sent")
        wait_until(lambda: sent.count() == rows, 120, 0.2, "every row sent")
    finally:
        first.kill()
        second.kill()
    made = calls(call_log)
    per_id = Counter(nid for _, nid in made)
    assert len(per_id) == rows and set(per_id.values()) == {1}
    per_worker = Counter(pid for pid, _ in made)
    # The first gave back half its partitions: the second sent a real part of the rest.
    assert per_worker[second.pid] > rows // 5, per_worker
    assert_one_event_per_final_outcome()


def test_a_tenants_limit_is_a_total_over_the_workers(start_worker, tmp_path):
    call_log = tmp_path / "calls.log"
    channel = slow_channel(call_log, max_concurrency=32)
    limit, rows, tenants = (
        20,
        120,
        ["00000000-0000-0000-0000-00000000000a", "00000000-0000-0000-0000-00000000000b"],
    )
    settings = {**SETTINGS, "TENANT_RATE_LIMITS": {"*": limit}}
    workers = [start_worker(LOOP, settings, name=f"w{i}") for i in range(2)]
    try:
        wait_until(lambda: _present() == 2, 60, message="2 workers present")
        with transaction.atomic():  # the rows appear with their tenants at once
            seed_due(channel, rows)
            NotificationEntity.objects.filter(channel=channel).update(tenant_id=tenants[0])
            half = NotificationEntity.objects.filter(channel=channel).order_by("id")[: rows // 2]
            NotificationEntity.objects.filter(pk__in=list(half.values_list("pk", flat=True))).update(
                tenant_id=tenants[1]
            )
        sent = NotificationEntity.objects.filter(status="sent")
        wait_until(lambda: sent.count() == rows, 60, 0.2, "every row sent")
    finally:
        for worker in workers:
            worker.kill()
    made = calls(call_log)
    assert len({nid for _, nid in made}) == rows == len(made)  # each row sent once
    assert len({pid for pid, _ in made}) == 2, "both workers sent"
    started = call_times(call_log)
    tenant_of = {str(pk): str(t) for pk, t in NotificationEntity.objects.values_list("pk", "tenant_id")}
    for tenant in tenants:
        times = sorted(at for nid, at in started.items() if tenant_of[nid] == tenant)
        assert len(times) == rows // 2
        # Counted over both workers, never above the limit in any second (each worker keeps half); one
        # more per worker for the moment between a start and the provider's line, which may vary.
        busiest = max_in_window(times)
        assert busiest <= limit + 2, (tenant, busiest)
        assert times[-1] - times[0] >= (rows // 2 - 1) / limit * 0.9, "limited, not merely slow"
