"""Real worker subprocesses and a private PostgreSQL cluster for the fault tests."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def worker_env(
    database_url: str,
    database_name: str,
    settings: Mapping[str, Any] | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment a worker subprocess needs to use the given database and settings."""
    env = dict(os.environ)
    env.update(
        {
            "DATABASE_URL": database_url,
            "NR_TEST_DATABASE_NAME": database_name,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "NR_TEST_SETTINGS_JSON": json.dumps(dict(settings or {})),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
            # A worker that outlives a test's wait is sent SIGABRT: faulthandler then writes every
            # thread's stack to its log, which the failure shows (WorkerProcess.wait).
            "PYTHONFAULTHANDLER": "1",
        }
    )
    env.update(extra or {})
    return env


class WorkerProcess:
    """``python -m django retry_worker ...`` as a real process; its output goes to a log file."""

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str], log_dir: Path, name: str = "worker"
    ) -> None:
        self.args = list(args)
        self.env = dict(env)
        self.log_path = Path(log_dir) / f"{name}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.signalled_at: float | None = None

    def start(self) -> WorkerProcess:
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "retry_worker", *self.args],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def send(self, sig: int) -> None:
        """Send ``sig`` to the worker (kept: the time it was sent)."""
        assert self.proc is not None
        self.signalled_at = time.monotonic()
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """kill -9 and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.send(signal.SIGKILL)
            self.proc.wait(10)

    def wait(self, timeout: float) -> int:
        """The exit status, waiting at most ``timeout`` seconds.

        A worker still running then fails the test with what it was doing: it is sent SIGABRT, on
        which faulthandler writes every thread's stack to its log, and the log's tail is the message.
        """
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the worker was still running {timeout:g} s later; its log, with its threads' stacks:\n"
                + self.abort_with_stacks()
            ) from None

    def abort_with_stacks(self) -> str:
        """End a worker that seems stuck with SIGABRT, on which faulthandler writes every thread's stack
        to its log; returns the log's tail."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGABRT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.output()[-8000:]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def fresh_interpreter(code: str) -> str:
    """What ``code`` prints in a fresh interpreter on the test settings (nothing imported yet)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Any, timeout: float, interval: float = 0.05, message: str = "condition") -> float:
    """Poll ``predicate`` until true; returns the seconds it took, fails after ``timeout``."""
    started = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{message} not reached within {timeout:g}s")
        time.sleep(interval)


class PrivateCluster:
    """A throwaway PostgreSQL 15 cluster in a temp dir, on a free port, that a test may stop and start.

    The shared server serves other developers' test runs: only this private one is ever restarted.
    initdb refuses to run as root, so as root the cluster runs as the ``postgres`` user.
    """

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nr-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self._user: str | None = "postgres" if os.geteuid() == 0 else None

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        kwargs: dict[str, Any] = {}
        if self._user:
            kwargs["user"] = self._user
        return subprocess.run(args, check=check, capture_output=True, timeout=60, **kwargs)

    def init(self) -> PrivateCluster:
        if self._user:
            pw = pwd.getpwnam(self._user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._run(
            str(PG_BIN / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\nfsync = off\nmax_connections = 40\n"
                "shared_buffers = 32MB\n"
            )
        return self

    def start(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            "30",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop", check=False
        )

    def connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True
        )

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


def signal_state(pid: int) -> str:
    """The signal lines of ``/proc/<pid>/status`` (ignored, blocked, pending, caught) and its thread
    count: what a process that did not stop on a signal was doing with it."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = [line.strip() for line in status if line.startswith(("Sig", "ShdPnd", "Threads"))]
    except OSError as exc:
        return f"/proc/{pid}/status unreadable: {exc}"
    return "; ".join(lines)


def stop_with(process: subprocess.Popen[str], sig: int, timeout: float) -> str:
    """Send ``sig`` and return the process's remaining output once it exits.

    A process still running after ``timeout`` seconds is ended (a later test must not find it holding
    its database or port) and the test fails with its signal state. It is ended by SIGABRT first: a
    Python started with ``PYTHONFAULTHANDLER=1`` then prints every thread's stack into its output, which
    says where it hung; SIGKILL if it is still there.
    """
    process.send_signal(sig)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = signal_state(process.pid)
        process.send_signal(signal.SIGABRT)
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        raise AssertionError(
            f"pid {process.pid} still ran {timeout:g} s after {signal.Signals(sig).name}: {state}\n"
            f"its output:\n{output or ''}"
        ) from None
    return output or ""
