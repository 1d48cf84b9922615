"""``python -m bench.call_timeline``: where one call's time goes in the latency-bound drain.

The drain of ``bench.run --only latency`` (a webhook channel at ``--concurrency``, a receiver on
127.0.0.1 answering in 20 ms, one ``retry_worker --once`` tick in this process, structlog writing its
events), timed from inside: the benchmark wraps a few of the engine's and aiohttp's methods to note when
each call starts, when its request is written, when its answer's headers are read and when it is handed
over, and when the worker's thread runs its send loop. Printed, for each round:

* how many calls were in flight on average, of ``--concurrency`` (the scheduling's share of a slot);
* a call's mean time from its start to its hand-over, split at the request written and the headers
  read, against the receiver's 20 ms and against the same requests sent by aiohttp alone just before
  (no database, no scheduling);
* how much of the drain the worker's thread spent outside its send loop (the loop stands still then, so
  answers wait), and the longest such spans;
* how much of the drain the worker's thread ran on a core, and how much it was ready to run but waited
  for one (the kernel's per-thread ``schedstat``, Linux only): on a machine whose cores the worker
  shares with PostgreSQL and the receiver, a send that wakes either of them may hand it the worker's
  core, and the loop stands still until it gets one back.

Only means are taken across calls (starts, writes and reads are counted, not paired), so the wrapped
methods cost a few microseconds a call. The figures explain the ratio ``bench.run`` reports; the run's
own rows/s is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.cluster import run_on_server
from bench.db import bench_dbname, recreate_database, setup_django
from bench.http_clients import aiohttp_client, drive
from bench.receiver import Sink, http_drain
from bench.report import table

RECEIVER_DELAY = 0.02


class Marks:
    """Times (``perf_counter``) of each noted moment, and the spans the worker's thread ran its loop."""

    def __init__(self) -> None:
        self.moments: dict[str, list[float]] = {"start": [], "written": [], "headers": [], "handed": []}
        self.loop_spans: list[tuple[float, float]] = []

    def clear(self) -> None:
        for times in self.moments.values():
            times.clear()
        self.loop_spans.clear()

    def mean(self, moment: str) -> float:
        times = self.moments[moment]
        return sum(times) / len(times)


def _wrap(marks: Marks) -> None:
    """Note the moments: wrap the dispatcher's start and hand-over, aiohttp's request write and header
    read, and the send loop's runs."""
    import aiohttp.client_reqrep as reqrep

    from notifications_retry.engine.dispatcher import Dispatcher
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

    def noting(moment: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks.moments[moment].append(time.perf_counter())
            return method(*args, **kwargs)

        return wrapper

    def noting_after(moment: str, method: Callable[..., Any]) -> Callable[..., Any]:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = await method(*args, **kwargs)
            marks.moments[moment].append(time.perf_counter())
            return result

        return wrapper

    def timing(method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                marks.loop_spans.append((began, time.perf_counter()))

        return wrapper

    Dispatcher._call_started = noting("start", Dispatcher._call_started)  # type: ignore[method-assign]
    Dispatcher._hand_over = noting("handed", Dispatcher._hand_over)  # type: ignore[method-assign]
    reqrep.ClientRequest.send = noting("written", reqrep.ClientRequest.send)  # type: ignore[method-assign]
    reqrep.ClientResponse.start = noting_after("headers", reqrep.ClientResponse.start)  # type: ignore[method-assign]
    for name in ("wait", "pause", "run"):
        setattr(SteppedLoop, name, timing(getattr(SteppedLoop, name)))


def in_flight(starts: list[float], ends: list[float]) -> float:
    """Mean calls in flight from the first start to the last end."""
    events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends])
    area, level, last = 0.0, 0, events[0][0]
    for at, step in events:
        area += level * (at - last)
        level, last = level + step, at
    return area / (events[-1][0] - events[0][0])


def outside_loop(spans: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """The time between the loop's runs (within the drain), and those gaps longest first."""
    spans = sorted(spans)
    gaps = sorted((b[0] - a[1] for a, b in itertools.pairwise(spans)), reverse=True)
    return sum(gaps), gaps


def _measure(args: argparse.Namespace) -> int:
    from bench.settings import configure_logging

    print(
        f"notifications_retry call timeline — database {bench_dbname()!r}; {os.cpu_count()} CPUs; "
        f"{args.rows:,} webhook rows at max_concurrency {args.concurrency}, receiver answering in "
        f"{RECEIVER_DELAY * 1000:.0f} ms, one retry_worker --once tick, structlog writing its events"
    )
    recreate_database()
    setup_django()
    configure_logging("native")
    marks = Marks()
    _wrap(marks)
    sink = Sink(RECEIVER_DELAY)
    rows = []
    try:
        for round_ in range(1, args.rounds + 1):
            bare = asyncio.run(drive(aiohttp_client, sink.url, args.rows, args.concurrency))["rps"]
            marks.clear()
            result = http_drain(sink, args.rows, max_concurrency=args.concurrency, rate=None)
            moments = marks.moments
            if not moments["start"] or len(moments["start"]) != len(moments["handed"]):
                counts = {k: len(v) for k, v in moments.items()}
                print(f"round {round_}: the calls were not all seen ({counts})")
                return 1
            drain = moments["handed"][-1] - moments["start"][0]
            outside, gaps = outside_loop(marks.loop_spans)
            ms = {
                k: (marks.mean(b) - marks.mean(a)) * 1000
                for k, (a, b) in {
                    "start→written": ("start", "written"),
                    "written→headers": ("written", "headers"),
                    "headers→handed": ("headers", "handed"),
                    "start→handed": ("start", "handed"),
                }.items()
            }
            rows.append(
                [
                    str(round_),
                    f"{result['rows_per_s']:,.0f}",
                    f"{result['rows_per_s'] / (args.concurrency / RECEIVER_DELAY):.0%}",
                    f"{in_flight(moments['start'], moments['handed']):.1f}",
                    f"{ms['start→handed']:.1f}",
                    f"{args.concurrency / bare * 1000:.1f}",
                    f"{ms['start→written']:.2f}",
                    f"{ms['written→headers']:.1f}",
                    f"{ms['headers→handed']:.2f}",
                    f"{outside / drain:.0%}",
                    f"{gaps[0] * 1000:.1f}" if gaps else "-",
                    *(f"{share:.0%}" if share is not None else "-" for share in result["core_shares"]),
                ]
            )
    finally:
        sink.stop()
    headers = [
        "round",
        "rows/s",
        "of bound",
        "in flight",
        "call ms",
        "bare client ms",
        "start→written",
        "written→headers",
        "headers→handed",
        "outside loop",
        "longest ms",
        "on a core",
        "waiting for one",
    ]
    print("\n" + table(headers, rows))
    print(
        f"\nin flight: mean calls under way, of {args.concurrency}; call ms: a call's mean time from its "
        f"start to its hand-over (the receiver holds each {RECEIVER_DELAY * 1000:.0f} ms), split at its "
        "request written and its answer's headers read; bare client ms: the same requests from aiohttp alone "
        "(no database, no scheduling), just before; outside loop: the share of the drain the worker's "
        "thread ran its own code with the send loop standing still, and the longest such span; on a core, "
        "waiting for one: the share of the drain the worker's thread ran, and was ready to run but "
        "waited for a core (the rest it waited for answers)."
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.call_timeline", description=description)
    parser.add_argument("--rows", type=int, default=9600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_call_timeline_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
