"""A throwaway PostgreSQL cluster for the benchmark, so WAL figures count only the benchmark's writes.

WAL positions are cluster-wide: on a server shared with other work, every other session's writes
land between the two ``pg_current_wal_lsn()`` readings around a drain. A private cluster (the
server's own binaries, default settings but autovacuum off, on a free loopback port) isolates them.
The benchmark vacuums explicitly after seeding, so autovacuum is not needed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")


def pg_bin() -> Path | None:
    """The directory of initdb / pg_ctl / pg_waldump, or None when no server binaries are installed."""
    for candidate in (os.environ.get("NR_BENCH_PG_BIN", ""), *PG_BIN_CANDIDATES):
        if candidate and (Path(candidate) / "initdb").exists():
            return Path(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """initdb + pg_ctl in a temporary directory; ``url`` once started. Runs as ``postgres`` under root."""

    def __init__(self, settings: str = "") -> None:
        self.settings = settings  # more postgresql.conf lines (shared_preload_libraries, ...)
        found = pg_bin()
        if found is None:
            raise RuntimeError("no PostgreSQL server binaries found (set NR_BENCH_PG_BIN)")
        self.bin = found
        self.dir = Path(tempfile.mkdtemp(prefix="nr-bench-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self._user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        kwargs: dict[str, Any] = {"user": self._user} if self._user else {}
        return subprocess.run(args, check=check, capture_output=True, timeout=120, **kwargs)

    def start(self) -> PrivateCluster:
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "shared_buffers = 128MB\nmax_connections = 60\nautovacuum = off\nmax_wal_size = 4GB\n"
                + self.settings
            )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "server.log"), "-w", "start"
        )
        return self

    def waldump(self, start_lsn: str, end_lsn: str) -> subprocess.Popen[str]:
        """``pg_waldump`` of the records between two LSNs, as a text stream."""
        return subprocess.Popen(
            [str(self.bin / "pg_waldump"), "-p", str(self.data / "pg_wal"), "-s", start_lsn, "-e", end_lsn],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def cpu_seconds(self) -> float:
        """CPU seconds the whole cluster has used: the postmaster, its live processes, and (through the
        postmaster's children counters) every backend that has exited."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        total = 0.0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue  # ended while listing; its time is in the postmaster's children counters
            pid, ppid = int(entry), int(fields[1])
            if pid == postmaster:
                total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
            elif ppid == postmaster:
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False
        )
        shutil.rmtree(self.dir, ignore_errors=True)


def run_on_server(server: str, measure: Callable[[], int], settings: str = "") -> int:
    """Run ``measure`` on a private cluster (``private``, with ``settings`` added to its
    postgresql.conf) or on the server of DATABASE_URL (``url``)."""
    if server == "url":
        return measure()
    global _active
    cluster = _active = PrivateCluster(settings).start()
    os.environ["DATABASE_URL"] = cluster.url
    try:
        return measure()
    finally:
        _active = None
        cluster.stop()


_active: PrivateCluster | None = None


def active_cluster() -> PrivateCluster | None:
    """The private cluster the benchmark runs on now, if any (its CPU is the benchmark's alone)."""
    return _active
