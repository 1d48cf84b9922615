"""A worker holds at most three connections to PostgreSQL while it drains webhook or inline rows and
relays their events: its lock's (which also holds the relay's key locks and its partitions' locks),
Django's, and its send loop's, where the claims and the commits take turns; N workers hold 3 N. Counted in
``pg_stat_activity`` every few milliseconds, each backend traced to its worker process by its client
port."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections

from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from tests.process.conftest import StartWorker, seed_due
from tests.process.helpers import webhook_channel
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import REPO_ROOT, wait_until, worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROWS = 1_500
#: The most connections a worker may hold during a drain, its lock's included.
MOST = 3

BACKENDS = """
SELECT client_port FROM pg_stat_activity
WHERE datname = %s AND backend_type = 'client backend' AND client_port IS NOT NULL
"""


def server_port() -> int:
    """The PostgreSQL server's port the workers connect to."""
    return int(connection.settings_dict.get("PORT") or 5432)


def local_ports(pid: int, remote_port: int) -> set[int]:
    """The local TCP ports of process ``pid``'s sockets connected to ``remote_port`` (its end of each).

    Only those: Linux gives one local port number to several sockets bound for different destinations,
    so a port of the worker's connection to the webhook receiver may equal a port of another client of
    the database (the test's own), which a match on the number alone would count as the worker's."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class ConnectionSampler(threading.Thread):
    """Counts, every few milliseconds, the test database's backends whose client is each worker process."""

    def __init__(self, dbname: str, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.dbname, self.pids = dbname, pids
        self.port = server_port()
        #: For each worker, how many samples saw it hold each count of connections.
        self.counts: dict[int, collections.Counter[int]] = {pid: collections.Counter() for pid in pids}
        #: Samples of the workers' connections together.
        self.totals: collections.Counter[int] = collections.Counter()
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        conn = connections.create_connection("default")
        try:
            while not self.done.is_set():
                with conn.cursor() as cursor:
                    cursor.execute(BACKENDS, [self.dbname])
                    clients = {row[0] for row in cursor.fetchall()}
                # Read after the backends: a connection opened in between is not counted, never one
                # closed in between (its port is no longer the worker's).
                held = {pid: len(clients & local_ports(pid, self.port)) for pid in self.pids}
                for pid, count in held.items():
                    self.counts[pid][count] += 1
                self.totals[sum(held.values())] += 1
                time.sleep(0.005)
        except BaseException as exc:
            self.error = exc
        finally:
            conn.close()


def drain_sampled(
    sampler: ConnectionSampler, channel: ChannelConfig, publisher: str, rows: int = ROWS
) -> None:
    """Seed the drain's rows, wait until every one is sent and its event published by ``publisher``, then
    stop the sampler."""
    seed_due(channel, rows)
    try:
        wait_until(
            lambda: not NotificationEntity.objects.exclude(status="sent").exists(),
            120,
            message="every row sent",
        )
        wait_until(
            lambda: not Outbox.objects.filter(published_at__isnull=True).exists(),
            30,
            message=f"every event published by {publisher}",
        )
    finally:
        sampler.done.set()
        sampler.join(10)


@pytest.mark.parametrize("workers", [1, 2])
def test_draining_and_relaying_workers_hold_at_most_three_connections_each(
    start_worker: StartWorker, workers: int
) -> None:
    receiver = ScriptedServer(lambda request: Reply(200, {"id": "m"}, delay=0.02)).start()
    try:
        channel = webhook_channel(receiver.url, max_concurrency=16)
        settings = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "PARTITIONS": workers}
        started = [
            start_worker(["--interval", "1", "--batch-size", "300"], settings, name=f"worker-{n}")
            for n in range(workers)
        ]
        sampler = ConnectionSampler(connection.settings_dict["NAME"], [w.pid for w in started])
        sampler.start()
        for worker in started:
            wait_until(lambda w=worker: "worker-tasks" in w.output(), 30, message="the worker's start")
        drain_sampled(sampler, channel, "the workers' relays")
        for worker in started:
            worker.send(signal.SIGTERM)
        for worker in started:
            assert worker.wait(30) == 0, worker.output()[-3000:]
    finally:
        receiver.stop()
    assert sampler.error is None, sampler.error
    for pid, counts in sampler.counts.items():
        print(f"worker {pid}: samples of each count of its connections: {dict(sorted(counts.items()))}")
    print(f"{workers} worker(s) together: {dict(sorted(sampler.totals.items()))}")
    assert Outbox.objects.count() == ROWS
    assert any("outbox-event-published" in worker.output() for worker in started)
    # How many samples fit in the drain depends on the machine (each reads /proc/net/tcp): a few suffice.
    assert sum(sampler.totals.values()) >= 10, "the drain was sampled"
    for counts in sampler.counts.values():
        assert max(counts) <= MOST, counts
    assert max(sampler.totals) <= MOST * workers, sampler.totals


def test_a_worker_draining_an_inline_backlog_holds_at_most_three_connections(
    start_worker: StartWorker,
) -> None:
    """Claims run two at a time on an inline backlog: the one beside takes the place of Django's."""
    rows = 6_000
    channel = ChannelConfig.objects.create(key="inline", provider_key="stub", max_attempts=5)
    worker = start_worker(["--interval", "1", "--batch-size", "5000"], {})
    sampler = ConnectionSampler(connection.settings_dict["NAME"], [worker.pid])
    sampler.start()
    wait_until(lambda: "worker-tasks" in worker.output(), 30, message="the worker's start")
    drain_sampled(sampler, channel, "the worker's relay", rows)
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()[-3000:]
    assert sampler.error is None, sampler.error
    counts = sampler.counts[worker.pid]
    print(f"inline drain: samples of each count of its connections: {dict(sorted(counts.items()))}")
    assert Outbox.objects.count() == rows
    assert sum(counts.values()) >= 10, "the drain was sampled"
    assert max(counts) <= MOST, counts


def test_a_worker_and_outbox_relay_hold_three_and_two(start_worker: StartWorker, tmp_path: Path) -> None:
    receiver = ScriptedServer(lambda request: Reply(200, {"id": "m"}, delay=0.02)).start()
    database_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    env = worker_env(database_url, connection.settings_dict["NAME"], {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]})
    relay_log = (tmp_path / "relay.log").open("wb")
    relay = subprocess.Popen(
        [sys.executable, "-m", "django", "outbox_relay", "--publisher", "log"],
        env=env,
        cwd=REPO_ROOT,
        stdout=relay_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        channel = webhook_channel(receiver.url, max_concurrency=16)
        worker = start_worker(
            ["--interval", "1", "--batch-size", "300", "--no-relay"], {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
        )
        sampler = ConnectionSampler(connection.settings_dict["NAME"], [worker.pid, relay.pid])
        sampler.start()
        wait_until(lambda: "worker-tasks" in worker.output(), 30, message="the worker's start")
        drain_sampled(sampler, channel, "outbox_relay")
        worker.send(signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()[-3000:]
    finally:
        receiver.stop()
        relay.send_signal(signal.SIGTERM)
        relay.wait(30)
        relay_log.close()
    assert sampler.error is None, sampler.error
    worker_counts, relay_counts = sampler.counts[worker.pid], sampler.counts[relay.pid]
    for name, counts in (("retry_worker --no-relay", worker_counts), ("outbox_relay", relay_counts)):
        print(f"{name}: samples of each count of its connections: {dict(sorted(counts.items()))}")
    assert "outbox-event-published" not in worker.output()
    # How many samples fit in the drain depends on the machine (each reads /proc/net/tcp): a few suffice.
    assert sum(sampler.totals.values()) >= 10, "the drain was sampled"
    assert max(worker_counts) <= MOST and max(relay_counts) <= 2, (worker_counts, relay_counts)
