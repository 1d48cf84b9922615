"""The benchmark's webhook receiver (``bench.sink``, in a subprocess) and the latency-bound drains."""

from __future__ import annotations

import bisect
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from bench.db import ROOT, add_rows, channel, reset_rows
from bench.worker_drain import timed_drain_once


class Sink:
    """The receiver, answering every POST ``delay`` seconds after it arrived, in its own process."""

    def __init__(self, delay: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.sink", "--delay", str(delay)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def _get(self, path: str) -> Any:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=30, trust_env=False).json()

    def reset(self) -> None:
        self._get("/reset")

    def stats(self) -> dict[str, Any]:
        """Arrival times (sorted) since the last reset, and the receiver's measured answer time."""
        stats: dict[str, Any] = self._get("/stats")
        stats["arrivals"] = sorted(stats["arrivals"])
        return stats

    def count(self) -> int:
        """POSTs received since the last reset."""
        return int(self._get("/count")["count"])

    def keys(self) -> dict[str, int]:
        """POSTs received per ``Idempotency-Key`` since the last reset."""
        keys: dict[str, int] = self._get("/keys")
        return keys

    def first_arrivals(self) -> dict[str, float]:
        """Each ``Idempotency-Key``'s first arrival (``time.time()``) since the last reset."""
        first: dict[str, float] = self._get("/first")
        return first

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The largest number of ``times`` inside any half-open window of ``window`` seconds."""
    best = 0
    for i, t in enumerate(times):
        best = max(best, bisect.bisect_left(times, t + window, lo=i) - i)
    return best


def webhook_channel(sink: Sink, *, max_concurrency: int, rate: float | None = None) -> int:
    """The ``hook`` channel, pointed at ``sink``."""
    return channel(
        "hook",
        "webhook",
        options={"url": sink.url},
        max_concurrency=max_concurrency,
        rate_limit_per_second=rate,
        timeout_seconds=10.0,
    )


def http_drain(sink: Sink, rows: int, *, max_concurrency: int, rate: float | None) -> dict[str, Any]:
    """Drain ``rows`` due rows of a webhook channel pointed at ``sink``; rows/s and the window peak."""
    reset_rows()
    cid = webhook_channel(sink, max_concurrency=max_concurrency, rate=rate)
    add_rows([cid], rows)
    sink.reset()
    drained = timed_drain_once(rows)
    sent, elapsed, cpu = drained.sent, drained.elapsed, drained.cpu
    received = sink.stats()
    arrivals = received["arrivals"]
    if sent != rows:
        raise RuntimeError(f"webhook drain sent {sent} of {rows}")
    span = (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else elapsed
    return {
        "rows_per_s": rows / elapsed,
        "cpu_ms_per_row": cpu * 1000 / rows,
        "cpu_share": cpu / elapsed,
        "send_rate": (len(arrivals) - 1) / span if span else 0.0,
        "max_per_1s_window": max_in_window(arrivals),
        "requests": len(arrivals),
        "answer_ms_mean": received["answer_ms_mean"],
        "core_shares": drained.core_shares,
    }
