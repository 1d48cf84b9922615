"""``python -m bench.threads`` (``make threads-bench``): the threads a looping worker runs during a
webhook drain, read from ``/proc/<pid>/task``.

A looping ``retry_worker`` drains ``--rows`` due rows of a webhook channel (``max_concurrency``
``--concurrency``) against a receiver on 127.0.0.1 answering in 20 ms; every 10 ms during the drain
the worker's threads are counted. Printed: the most threads seen at once, and how often each count
was seen.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

from bench.cluster import run_on_server
from bench.crash_worker import LoopingWorker
from bench.db import add_rows, bench_dbname, count_sent, recreate_database, reset_rows, setup_django
from bench.receiver import Sink, webhook_channel
from bench.report import table

RECEIVER_DELAY = 0.02
SAMPLE_SECONDS = 0.01


def thread_count(pid: int) -> int:
    """How many threads the process runs now (0 once it has exited)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry threads benchmark — database {bench_dbname()!r}; a looping retry_worker "
        f"draining {args.rows:,} webhook rows at max_concurrency {args.concurrency}, receiver answering in "
        f"{RECEIVER_DELAY * 1000:.0f} ms; /proc/<pid>/task every {SAMPLE_SECONDS * 1000:.0f} ms"
    )
    recreate_database()
    setup_django()
    sink = Sink(RECEIVER_DELAY)
    seen: collections.Counter[int] = collections.Counter()
    try:
        cid = webhook_channel(sink, max_concurrency=args.concurrency)
        reset_rows()
        add_rows([cid], args.rows)
        worker = LoopingWorker(["--batch-size", str(args.rows * 2), "--max-duration", "600"])
        try:
            deadline = time.monotonic() + args.timeout
            while count_sent() < args.rows and time.monotonic() < deadline:
                if sink.count() > 0:  # the drain is under way (the worker's start is not counted)
                    count = thread_count(worker.proc.pid)
                    if count:
                        seen[count] += 1
                time.sleep(SAMPLE_SECONDS)
        finally:
            worker.stop()
    finally:
        sink.stop()
    if not seen:
        print("no sample taken: the drain did not start")
        return 1
    total = sum(seen.values())
    rows = [[str(threads), f"{count / total:.0%}"] for threads, count in sorted(seen.items())]
    print("\n" + table(["threads", "share of samples"], rows))
    print(f"\nMost threads at once during the drain: {max(seen)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.threads", description=description)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=120.0, help="Longest the drain may take.")
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_threads_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
