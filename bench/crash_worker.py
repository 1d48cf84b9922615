"""A looping ``retry_worker`` subprocess for the crash benchmark, driven only through the command line.

The worker runs ``python -m django retry_worker`` with ``bench.settings`` on the benchmark database,
its output in a log file; the benchmark starts it, SIGKILLs it, or stops it with SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.db import ROOT, bench_dbname

LOOP_ARGS = ["--interval", "0.1", "--batch-size", "100000", "--max-duration", "60"]
# A short grace on top of the lease, so the leases a killed worker leaves run out soon.
WORKER_SETTINGS = {"LEASE_GRACE_SECONDS": 0.5, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}


def worker_env(settings: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The worker's environment; ``settings`` are added to :data:`WORKER_SETTINGS`."""
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "NR_BENCH_DATABASE_NAME": bench_dbname(),
            "NR_BENCH_SETTINGS_JSON": json.dumps({**WORKER_SETTINGS, **(settings or {})}),
            # The example project's allowlist variable, in case the settings read it from there.
            "NOTIFICATIONS_RETRY_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class LoopingWorker:
    """One ``retry_worker`` loop; ``kill()`` is SIGKILL, ``stop()`` a graceful SIGTERM."""

    log_dir = Path(tempfile.mkdtemp(prefix="nr-crash-bench-"))
    started_count = 0

    def __init__(self, args: list[str] | None = None, settings: Mapping[str, Any] | None = None) -> None:
        LoopingWorker.started_count += 1
        self.log_path = self.log_dir / f"worker-{LoopingWorker.started_count}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "django", "retry_worker", *(LOOP_ARGS if args is None else args)],
                env=worker_env(settings),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 30) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def output_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
