"""The worker's drain, driven only through its management command (``retry_worker --once``).

The engine behind the command may change; its options and the rows it leaves are the contract the
benchmark measures.
"""

from __future__ import annotations

import dataclasses
import time

from bench.costs import thread_schedule
from bench.db import count_sent


@dataclasses.dataclass(frozen=True)
class TimedDrain:
    """One :func:`drain_once` as this process lived it: rows sent, wall and CPU seconds, and the shares of
    the drain the calling thread (the worker's) ran on a core and waited, ready, for one (None off Linux)."""

    sent: int
    elapsed: float
    cpu: float
    core_shares: tuple[float | None, float | None]


def timed_drain_once(expected: int) -> TimedDrain:
    """:func:`drain_once`, timed."""
    schedule, started, cpu_started = thread_schedule(), time.perf_counter(), time.process_time()
    sent = drain_once(expected)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    after = thread_schedule()
    shares: tuple[float | None, float | None] = (None, None)
    if schedule is not None and after is not None:
        shares = ((after[0] - schedule[0]) / elapsed, (after[1] - schedule[1]) / elapsed)
    return TimedDrain(sent, elapsed, cpu, shares)


def drain_once(expected: int) -> int:
    """One ``retry_worker --once`` tick big enough for ``expected`` due rows; returns rows it sent.

    Django's connection is closed before and after, so the tick opens its own and the commit
    counters of its session are reported when it ends.
    """
    from django.core.management import call_command
    from django.db import connections

    before = count_sent()
    connections.close_all()
    call_command(
        "retry_worker",
        "--once",
        "--batch-size",
        str(expected + 1000),
        "--max-duration",
        "3600",
    )
    connections.close_all()
    return count_sent() - before
