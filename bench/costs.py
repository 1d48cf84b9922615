"""What a drain costs the database: WAL bytes and commits, read around it in the same run.

WAL: ``pg_current_wal_lsn()`` before and after the drain, after a ``CHECKPOINT`` (so every drain
pays the full-page images of the pages it touches first, as a drain between two checkpoints does).
Commits: the delta of ``pg_stat_database.xact_commit`` of the benchmark database (read-only
transactions count too: a tick's lock checks and reads are round trips the server serves). The
readings come from a connection to another database, so they add nothing to the counts; the drain's
connections are closed before the second reading, because a backend reports its counters at exit or
at most once a second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from bench.db import bench_dbname, conninfo

_READ = """
SELECT pg_current_wal_lsn()::text, xact_commit FROM pg_stat_database WHERE datname = %s
"""


@dataclasses.dataclass
class Cost:
    """One measured drain: rows delivered, wall seconds, WAL bytes and commits."""

    label: str
    rows: int
    seconds: float
    wal_bytes: int
    commits: int
    wal_range: tuple[str, str] = ("", "")
    server_cpu_s: float | None = None  # the drain's own backend, when it is tracked and local
    client_cpu_s: float | None = None  # this process, all threads
    cluster_cpu_s: float | None = None  # every process of the private cluster, when there is one

    @property
    def cpu_us_per_row(self) -> float | None:
        """Client + cluster CPU per row: unlike rows/s, it does not grow when others share the cores."""
        if self.client_cpu_s is None or self.cluster_cpu_s is None or not self.rows:
            return None
        return (self.client_cpu_s + self.cluster_cpu_s) * 1e6 / self.rows

    @property
    def server_cpu_us_per_row(self) -> float | None:
        return self.server_cpu_s * 1e6 / self.rows if self.server_cpu_s is not None and self.rows else None

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @property
    def wal_per_row(self) -> float:
        return self.wal_bytes / self.rows if self.rows else 0.0

    @property
    def commits_per_row(self) -> float:
        return self.commits / self.rows if self.rows else 0.0


def _monitor() -> psycopg.Connection[Any]:
    # The server's maintenance database: its own statements are not counted in the benchmark's.
    return psycopg.connect(conninfo("postgres"), autocommit=True)


def _reading(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(_READ, (bench_dbname(),)).fetchone()
    assert row is not None
    return str(row[0]), int(row[1])


def _settled_commits(conn: psycopg.Connection[Any]) -> tuple[str, int]:
    """The counters once closed backends have reported (they do on exit, a moment after close)."""
    lsn, commits = _reading(conn)
    for _ in range(50):
        time.sleep(0.1)
        lsn, later = _reading(conn)
        if later == commits:
            break
        commits = later
    return lsn, commits


def measure(label: str, drain: Callable[[], int]) -> Cost:
    """Run ``drain`` (returns rows delivered; closes its connections) and read what it cost."""
    from bench.cluster import active_cluster

    cluster = active_cluster()
    with _monitor() as conn:
        conn.execute("CHECKPOINT")
        _, commits_before = _settled_commits(conn)
        lsn_before, _ = _reading(conn)
        cluster_before = cluster.cpu_seconds() if cluster else None
        client_before = time.process_time()
        started = time.perf_counter()
        rows = drain()
        seconds = time.perf_counter() - started
        client_cpu = time.process_time() - client_before
        cluster_cpu = (
            cluster.cpu_seconds() - cluster_before if cluster and cluster_before is not None else None
        )
        lsn_after, _ = _reading(conn)
        _, commits_after = _settled_commits(conn)
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (lsn_after, lsn_before)
        ).fetchone()
        assert row is not None
    return Cost(
        label,
        rows,
        seconds,
        int(row[0]),
        commits_after - commits_before,
        (lsn_before, lsn_after),
        client_cpu_s=client_cpu,
        cluster_cpu_s=cluster_cpu,
    )


def backend_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process of this machine (a server backend, a worker); None once
    it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields 14 and 15 of /proc/PID/stat (utime, stime), counted after the command name's ")".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_schedule() -> tuple[float, float] | None:
    """Seconds the calling thread has run on a core, and waited ready to run for one (Linux's
    per-thread ``schedstat``; None elsewhere). A drain in this process runs on this thread, so the two
    tell the worker's own CPU from the time the machine's other work (PostgreSQL, the receiver) kept
    it off a core."""
    try:
        with open("/proc/thread-self/schedstat") as stat:
            on_core, waiting = stat.read().split()[:2]
    except (OSError, ValueError):
        return None
    return int(on_core) / 1e9, int(waiting) / 1e9


@dataclasses.dataclass
class ServerCpu:
    """Accumulates the CPU a drain's own connection used on the server: unlike wall time, it does
    not grow when other processes share the cores."""

    seconds: float = 0.0
    known: bool = True

    @contextlib.contextmanager
    def track(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        pid = conn.info.backend_pid
        before = backend_cpu_seconds(pid)
        try:
            yield
        finally:
            after = backend_cpu_seconds(pid)
            if before is None or after is None:
                self.known = False
            else:
                self.seconds += after - before
