"""Scenario 3: two and four worker processes on 10,000 due rows: one owner at a time, no double send."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connections

from notifications_retry.models import ChannelConfig, NotificationEntity
from tests.process.conftest import seed_due
from tests.process.helpers import ADVISORY_HOLDERS, assert_one_event_per_final_outcome, claimed_ids
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROWS = 10_000
SETTINGS = {
    "LEASE_GRACE_SECONDS": 0.5,
    "PROVIDERS": {"recording": "tests.support.fault_providers.RecordingProvider"},
}
LOOP = ["--interval", "0.05", "--batch-size", "1000", "--max-duration", "30"]


class LockSampler(threading.Thread):
    """Samples pg_locks every few milliseconds on its own connection: the most owners ever seen at once."""

    def __init__(self, dbname: str) -> None:
        super().__init__(daemon=True)
        self.dbname = dbname
        self.max_owners = 0
        self.samples = 0
        self.owners: list[int] = []
        self.done = threading.Event()

    def run(self) -> None:
        conn = connections.create_connection("default")
        try:
            while not self.done.is_set():
                with conn.cursor() as cursor:
                    cursor.execute(ADVISORY_HOLDERS, [self.dbname])
                    pids = [row[0] for row in cursor.fetchall()]
                self.samples += 1
                self.max_owners = max(self.max_owners, len(pids))
                if pids:
                    self.owners = pids
                time.sleep(0.005)
        finally:
            conn.close()


def calls(path: Path) -> Counter[str]:
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(line.split()[1] for line in lines)


def owner_pid(backend_pid: int, workers) -> int:
    """The worker process whose socket is the client end of ``backend_pid``'s connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT client_port FROM pg_stat_activity WHERE pid = %s", [backend_pid])
        (port,) = cursor.fetchone()
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            inodes.add(fields[9])
    for worker in workers:
        for fd in Path(f"/proc/{worker.pid}/fd").iterdir():
            try:
                target = fd.readlink().as_posix()
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                return worker.pid
    raise AssertionError(f"no worker owns backend {backend_pid}")


def run_workers(start_worker, tmp_path: Path, count: int, kill_owner: bool) -> None:
    call_log = tmp_path / "calls.log"
    channel = ChannelConfig.objects.create(
        key="in_app",
        provider_key="recording",
        timeout_seconds=1.0,
        max_attempts=5,
        options={"call_log": str(call_log)},
    )
    seed_due(channel, ROWS)
    from django.db import connection

    sampler = LockSampler(connection.settings_dict["NAME"])
    sampler.start()
    workers = [start_worker(LOOP, SETTINGS, name=f"w{i}") for i in range(count)]
    in_flight_at_kill = 0
    try:
        if kill_owner:
            wait_until(
                lambda: len(calls(call_log)) > ROWS // 5 and sampler.owners, 60, message="a busy owner"
            )
            owner = owner_pid(sampler.owners[0], workers)
            victim = next(w for w in workers if w.pid == owner)
            victim.kill()
            in_flight_at_kill = len(claimed_ids())
            standby = [w for w in workers if w is not victim]
            taken_over = len(calls(call_log))
            wait_until(lambda: len(calls(call_log)) > taken_over, 15, message="a standby took over")
            workers = standby
        wait_until(
            lambda: NotificationEntity.objects.filter(status="sent").count() == ROWS,
            120,
            0.2,
            "all rows sent",
        )
    finally:
        sampler.done.set()
        sampler.join(5)
        for worker in workers:
            worker.kill()
    sent_per_id = calls(call_log)
    assert len(sent_per_id) == ROWS
    doubles = sum(n - 1 for n in sent_per_id.values())
    assert doubles <= in_flight_at_kill, (doubles, in_flight_at_kill)
    if not kill_owner:
        assert doubles == 0
    assert sampler.samples > 50
    assert sampler.max_owners == 1
    assert_one_event_per_final_outcome()


def test_two_workers_on_10000_rows_no_double_send_one_owner(start_worker, tmp_path):
    run_workers(start_worker, tmp_path, 2, kill_owner=False)


def test_four_workers_owner_killed_standby_takes_over(start_worker, tmp_path):
    run_workers(start_worker, tmp_path, 4, kill_owner=True)
