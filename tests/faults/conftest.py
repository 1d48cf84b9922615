"""The network fault suite runs only when asked (``make faults``): it needs root and takes minutes.

Its scenarios share a pair of network namespaces, a throwaway PostgreSQL cluster and a webhook receiver
in the servers' namespace, and a ``retry_worker`` loop in the worker's.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.servers import NamespacedCluster, NamespacedWorker, Receiver
from tests.support.netns import NetworkPair, unavailable_reason
from tests.support.opt_in import skip_unless_asked
from tests.support.processes import REPO_ROOT, worker_env

LOOP = ["--interval", "1"]

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
