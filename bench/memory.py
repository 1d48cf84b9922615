"""The worker's RSS while it drains a large backlog in one tick (``--memory``), in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from bench.db import ROOT, add_rows, bench_dbname, channel, reset_rows, setup_django
from bench.worker_drain import drain_once


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child_memory_drain(rows: int) -> None:
    """(In the subprocess) drain ``rows`` with one tick, sampling RSS; prints JSON."""
    setup_django()
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.perf_counter()
        while not done.wait(0.5):
            samples.append((time.perf_counter() - t0, _rss_mb()))

    sampler = threading.Thread(target=sample, daemon=True)
    before = _rss_mb()
    sampler.start()
    started = time.perf_counter()
    sent = drain_once(rows)
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    rss = [s[1] for s in samples] or [_rss_mb()]
    tenth = max(1, len(rss) // 10)
    print(
        json.dumps(
            {
                "sent": sent,
                "seconds": elapsed,
                "rss_start_mb": before,
                "rss_after_10pct_mb": rss[tenth - 1],
                "rss_max_mb": max(rss),
                "rss_end_mb": rss[-1],
            }
        )
    )


def memory_drain(rows: int) -> dict[str, Any]:
    """Seed ``rows`` due rows and measure the child's drain."""
    reset_rows()
    add_rows([channel("stub", "stub")], rows)
    child = [sys.executable, "-m", "bench.run", "--child-memory-drain", str(rows)]
    out = subprocess.run(
        child,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "NR_BENCH_DATABASE_NAME": bench_dbname()},
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
