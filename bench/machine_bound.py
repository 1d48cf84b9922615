"""``python -m bench.machine_bound`` (``make bench-machine``): is a drain bound by a worker or the machine?

The latency-bound drain of ``bench.run --only latency`` at ``max_concurrency`` 128 (receiver answering in
20 ms: a bound of 6,400 rows a second), run by 1 and then 2 identical looping ``retry_worker``
processes (``PARTITIONS`` 2, so two workers split the channel's 128 between them and each has a core's
worth of thread to itself). For each: rows a second at the receiver, its share of the bound, and the CPU
each row cost while the receiver was being sent to: the whole machine's (``/proc/stat``), PostgreSQL's
(every process of the private cluster, background ones included), the receiver's (``bench.sink``) and
the rest (the workers, with the kernel's share), and how busy the machine's cores were meanwhile.

If a second worker adds rows a second, one worker's thread was the limit; if it adds none while the
machine's cores are all busy, the cores are, and no arrangement of one worker's work could reach more:
80 % of the bound leaves each row at most ``cores ÷ 5,120`` seconds of the machine's CPU. Runs on a
private cluster by default, so that PostgreSQL's CPU is the benchmark's alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from typing import Any

from bench.cluster import active_cluster, run_on_server
from bench.costs import backend_cpu_seconds
from bench.db import bench_dbname, recreate_database
from bench.receiver import Sink, webhook_channel
from bench.report import table
from bench.scale import drain

RECEIVER_DELAY = 0.02


@dataclasses.dataclass(frozen=True)
class Sample:
    """CPU seconds used so far, at one moment (``time.time()``, the receiver's clock)."""

    at: float
    busy: float  # the machine's, all cores
    total: float  # the machine's, busy or idle
    postgres: float | None  # None on a server of another machine's (--server url): not counted
    receiver: float


class Sampler(threading.Thread):
    """Samples the machine's, PostgreSQL's and the receiver's CPU every ``interval`` seconds."""

    def __init__(self, sink: Sink, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.sink, self.interval = sink, interval
        self.samples: list[Sample] = []
        self.done = threading.Event()

    def sample(self) -> Sample:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
        hz = os.sysconf("SC_CLK_TCK")
        cluster = active_cluster()
        return Sample(
            at=time.time(),
            busy=(sum(ticks) - ticks[3] - ticks[4]) / hz,  # all but idle and iowait
            total=sum(ticks) / hz,
            postgres=cluster.cpu_seconds() if cluster is not None else None,
            receiver=backend_cpu_seconds(self.sink.proc.pid) or 0.0,
        )

    def run(self) -> None:
        while not self.done.wait(self.interval):
            self.samples.append(self.sample())

    def between(self, start: float, end: float) -> tuple[Sample, Sample]:
        """The first sample at or after ``start`` and the last at or before ``end``."""
        inside = [s for s in self.samples if start <= s.at <= end]
        if len(inside) < 2:
            raise RuntimeError("the drain was too short to sample: give more --rows")
        return inside[0], inside[-1]


def measured_drain(sink: Sink, cid: int, *, workers: int, rows: int, timeout: float) -> dict[str, Any]:
    """One drain by ``workers`` looping workers; the CPU each part of the machine spent a row while
    the receiver was being sent to (from its first POST to its last)."""
    sampler = Sampler(sink)
    sampler.start()
    try:
        result = drain(
            sink, cid, workers=workers, rows=rows, partitions=2, max_in_flight=512, timeout=timeout
        )
    finally:
        sampler.done.set()
        sampler.join()
    arrivals = sink.stats()["arrivals"]
    first, last = sampler.between(arrivals[0], arrivals[-1])
    sent = sum(1 for at in arrivals if first.at <= at <= last.at)
    machine = (last.busy - first.busy) * 1000 / sent
    postgres = None
    if last.postgres is not None and first.postgres is not None:
        postgres = (last.postgres - first.postgres) * 1000 / sent
    receiver = (last.receiver - first.receiver) * 1000 / sent
    return {
        "rows_per_s": result["rows_per_s"],
        "machine": machine,
        "postgres": postgres,
        "receiver": receiver,
        "workers": None if postgres is None else machine - postgres - receiver,
        "busy": (last.busy - first.busy) / (last.total - first.total),
    }


def _measure(args: argparse.Namespace) -> int:
    bound = args.max_concurrency / RECEIVER_DELAY
    cores = os.cpu_count() or 1
    print(
        f"notifications_retry machine-bound benchmark — database {bench_dbname()!r}; receiver answering in "
        f"{RECEIVER_DELAY * 1000:.0f} ms, max_concurrency {args.max_concurrency} "
        f"(bound {bound:,.0f} rows/s), {args.rows:,} rows per drain, {cores} CPUs"
    )
    recreate_database()  # and Django set up on it
    sink = Sink(RECEIVER_DELAY)
    lines = []
    try:
        cid = webhook_channel(sink, max_concurrency=args.max_concurrency)
        for _ in range(args.rounds):
            for workers in args.workers:
                r = measured_drain(sink, cid, workers=workers, rows=args.rows, timeout=args.step_timeout)
                lines.append(
                    [
                        f"{workers}",
                        f"{r['rows_per_s']:,.0f}",
                        f"{r['rows_per_s'] / bound:.0%}",
                        "—" if r["workers"] is None else f"{r['workers']:.3f}",
                        f"{r['receiver']:.3f}",
                        "—" if r["postgres"] is None else f"{r['postgres']:.3f}",
                        f"{r['machine']:.3f}",
                        f"{r['busy']:.0%}",
                    ]
                )
                print(f"{workers} worker(s): {r['rows_per_s']:,.0f} rows/s", flush=True)
    finally:
        sink.stop()
    header = ["workers", "rows/s", "of bound", "workers", "receiver", "PostgreSQL", "machine", "cores busy"]
    print(
        "\nCPU ms a row while the receiver was being sent to (workers: the machine's less PostgreSQL's and"
        "\nthe receiver's, so with the kernel's share and the benchmark's own polling):"
    )
    print(table(header, lines))
    ceiling = cores * 1000 / (0.8 * bound)
    print(f"80 % of the bound leaves the machine at most {ceiling:.3f} ms of CPU a row ({cores} cores).")
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.machine_bound", description=description)
    parser.add_argument("--rows", type=int, default=38_400, help="Due rows per drain.")
    parser.add_argument("--max-concurrency", type=int, default=128, help="The channel's: a total.")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=1, help="Times the whole series runs.")
    parser.add_argument("--step-timeout", type=float, default=180.0, help="Longest wait for any one drain.")
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_machine_bench")
    started = time.monotonic()
    code = run_on_server(args.server, lambda: _measure(args))
    print(f"({time.monotonic() - started:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
