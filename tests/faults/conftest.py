"""The network fault suite runs only when asked (``make faults``): it needs root and takes minutes.

Its scenarios share a pair of network namespaces, a throwaway PostgreSQL cluster and a webhook receiver
in the servers' namespace, and a ``retry_worker`` loop in the worker's.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.servers import NamespacedCluster, NamespacedWorker, Receiver, Request
from tests.process.conftest import INSERT_DUE
from tests.support.netns import NetworkPair, unavailable_reason
from tests.support.opt_in import skip_unless_asked
from tests.support.processes import REPO_ROOT, worker_env

LOOP = ["--interval", "1"]
NOT_SENT = "SELECT count(*) FROM notifications_retry_notificationentity WHERE status <> 'sent'"
#: Outbox events and the notifications they are for: one each, once every row is Sent.
EVENTS = "SELECT count(*), count(DISTINCT key) FROM notifications_retry_outbox"


_CHANNEL = """
INSERT INTO notifications_retry_channelconfig (key, is_enabled, provider_key, max_attempts,
    retry_backoff, backoff_base_seconds, backoff_cap_seconds, timeout_seconds, max_concurrency,
    rate_limit_per_second, options, created_at, updated_at)
VALUES ('hook', true, 'webhook', %(attempts)s, 'exponential', 1, 60, 10.0, 10, %(rate)s, %(options)s,
        now(), now()) RETURNING id
"""


def seed_webhook_drain(
    cluster: NamespacedCluster,
    receiver: Receiver,
    rows: int,
    *,
    max_attempts: int = 5,
    rate: float | None = None,
) -> None:
    """A webhook channel ``hook`` posting to ``receiver`` (10 at once, 10 s timeout) and ``rows`` due rows."""
    with cluster.connect() as db:
        options = json.dumps({"url": receiver.url})
        channel = db.execute(
            _CHANNEL, {"attempts": max_attempts, "rate": rate, "options": options}
        ).fetchone()
        assert channel is not None
        db.execute(INSERT_DUE, {"channel": channel[0], "count": rows, "attempts": 1})


@dataclasses.dataclass
class DrainEnd:
    """What a scenario's drain left, once its worker was stopped."""

    exit_status: int
    output: str
    requests: list[Request]
    per_key: Counter[str]
    lost: int
    events: int
    event_keys: int


def stop_and_count(worker: NamespacedWorker, receiver: Receiver, cluster: NamespacedCluster) -> DrainEnd:
    """SIGTERM the worker, wait for it to exit, then count requests per key, rows not Sent and events."""
    worker.send(signal.SIGTERM)
    exit_status = worker.wait(60)
    requests = receiver.requests()
    with cluster.connect() as db:
        events, event_keys = db.execute(EVENTS).fetchone() or (0, 0)
    return DrainEnd(
        exit_status,
        worker.output(),
        requests,
        Receiver.per_key(requests),
        not_sent(cluster),
        events,
        event_keys,
    )


def not_sent(cluster: NamespacedCluster) -> int:
    """Rows of the scenario's cluster not Sent yet."""
    with cluster.connect() as db:
        row = db.execute(NOT_SENT).fetchone()
    return int(row[0]) if row else -1


FAULTS_ENV = "NR_FAULTS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        action="store_true",
        default=False,
        help="Also run the network fault scenarios (@pytest.mark.faults); or set NR_FAULTS=1.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_asked(
        config,
        items,
        marker="faults",
        option="--faults",
        env=FAULTS_ENV,
        reason="network fault scenario: run with --faults or NR_FAULTS=1 (make faults)",
    )


@pytest.fixture
def network() -> Iterator[NetworkPair]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot make network namespaces here: {reason}")
    pair = NetworkPair().create()
    try:
        yield pair
    finally:
        pair.destroy()


@pytest.fixture
def cluster(network: NetworkPair) -> Iterator[NamespacedCluster]:
    cluster = NamespacedCluster(network.servers, network.worker).init()
    try:
        cluster.start()
        migrated = subprocess.run(
            [
                *network.worker.exec_prefix(),
                sys.executable,
                "-m",
                "django",
                "migrate",
                "--noinput",
                "-v",
                "0",
            ],
            env=worker_env(cluster.url, "postgres"),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def receiver(network: NetworkPair, tmp_path: Path) -> Iterator[Receiver]:
    receiver = Receiver(network.servers, tmp_path).start()
    try:
        yield receiver
    finally:
        receiver.stop()


StartWorker = Callable[[dict[str, str]], NamespacedWorker]


@pytest.fixture
def start_worker(network: NetworkPair, tmp_path: Path) -> Iterator[StartWorker]:
    """Start ``retry_worker`` in the worker's namespace; killed at teardown if a failure left it running."""
    started: list[NamespacedWorker] = []

    def start(env: dict[str, str]) -> NamespacedWorker:
        started.append(NamespacedWorker(network.worker, LOOP, env, tmp_path, "worker").start())
        return started[-1]

    yield start
    for worker in started:
        worker.kill()
