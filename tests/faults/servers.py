"""The processes of the network fault test, each in its namespace: PostgreSQL, the receiver, the worker.

The test itself stays in its own namespace and never crosses the faulty link: it reaches PostgreSQL
through the cluster's Unix socket (a file, not a network address) and reads the receiver's request log.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.support.netns import Side
from tests.support.processes import PG_BIN, REPO_ROOT, PrivateCluster, WorkerProcess, free_port


class NamespacedCluster(PrivateCluster):
    """A throwaway PostgreSQL 15 cluster on the servers' veth address, trusting the worker's address."""

    def __init__(self, side: Side, client: Side) -> None:
        super().__init__()
        self.side = side
        self.client = client
        self.url = f"postgres://postgres@{side.address}:{self.port}/postgres"

    def init(self) -> NamespacedCluster:
        super().init()
        with (self.data / "postgresql.conf").open("a") as conf:
            # A later line wins: the veth address replaces the loopback one set by PrivateCluster.
            conf.write(f"listen_addresses = '{self.side.address}'\nmax_connections = 60\n")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.client.address}/32 trust\n")
        return self

    def start(self) -> None:
        # `ip netns exec` needs root and initdb's files belong to postgres: enter, then drop to postgres.
        runuser = ["runuser", "-u", "postgres", "--"] if self._user else []
        subprocess.run(
            [
                *self.side.exec_prefix(),
                *runuser,
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "server.log"),
                "-w",
                "-t",
                "30",
                "start",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        """A connection through the Unix socket: it never crosses the faulty link."""
        return psycopg.connect(
            host=str(self.dir), port=self.port, user="postgres", dbname=dbname, autocommit=True
        )


@dataclass(frozen=True)
class Request:
    at: float
    key: str


class Receiver:
    """:mod:`tests.faults.receiver` in the servers' namespace; its requests come from its log."""

    def __init__(self, side: Side, log_dir: Path) -> None:
        self.side = side
        self.port = free_port()
        self.log = log_dir / "receiver-requests.log"
        self.url = f"http://{side.address}:{self.port}/hook"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Receiver:
        self.log.touch()
        self.proc = subprocess.Popen(
            [
                *self.side.exec_prefix(),
                sys.executable,
                "-m",
                "tests.faults.receiver",
                "--host",
                self.side.address,
                "--port",
                str(self.port),
                "--log",
                str(self.log),
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"listening":
            raise RuntimeError("the receiver did not start")
        return self

    def requests(self) -> list[Request]:
        text = self.log.read_text()
        # The last line may be half-written while the receiver appends: keep only whole ones.
        lines = text.split("\n")[:-1]
        return [Request(float(at), key) for at, _, key in (line.partition(" ") for line in lines)]

    def count(self) -> int:
        return len(self.requests())

    @staticmethod
    def per_key(requests: list[Request]) -> Counter[str]:
        return Counter(request.key for request in requests)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class NamespacedWorker(WorkerProcess):
    """``retry_worker`` started inside the worker's namespace (``ip netns exec`` execs it: same pid)."""

    def __init__(self, side: Side, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.side = side

    def start(self) -> NamespacedWorker:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [*self.side.exec_prefix(), sys.executable, "-m", "django", "retry_worker", *self.args],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.started_at = time.monotonic()
        return self
