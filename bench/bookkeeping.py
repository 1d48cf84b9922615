"""``python -m bench.bookkeeping``: what a tick's bookkeeping costs a drain of a large backlog.

A worker on default settings ends a tick every ``BATCH_SIZE`` (200) rows; after a tick it owns it counts
the backlog and writes the lane's heartbeat, at most every ``BOOKKEEPING_SECONDS``. This drains
``--rows`` due ``stub`` rows by ``--batch-size`` ticks in process, with the window as shipped and with
none (the counts after every tick), interleaved over ``--rounds``; rows/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.cluster import run_on_server
from bench.db import add_rows, bench_dbname, channel, count_sent, recreate_database, reset_rows, setup_django
from bench.report import table


def _drain(cid: int, rows: int, batch_size: int, window: float) -> float:
    """Rows/s of ticks of ``batch_size`` rows until ``rows`` due rows are sent, with ``window``."""
    from django.db import connection

    import notifications_retry.engine.reporting as bookkeeping_module
    import notifications_retry.engine.worker as worker_module

    reset_rows()
    add_rows([cid], rows)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE notifications_retry_notificationentity")
    shipped, bookkeeping_module.BOOKKEEPING_SECONDS = bookkeeping_module.BOOKKEEPING_SECONDS, window
    try:
        worker = worker_module.Worker(batch_size=batch_size)
        started = time.perf_counter()
        while count_sent() < rows:
            worker.tick()
        seconds = time.perf_counter() - started
        worker.close()
    finally:
        bookkeeping_module.BOOKKEEPING_SECONDS = shipped
    return rows / seconds


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry bookkeeping benchmark — database {bench_dbname()!r}; {args.rows:,} due rows, "
        f"ticks of {args.batch_size}"
    )
    recreate_database()
    setup_django()
    import notifications_retry.engine.reporting as bookkeeping_module
    from bench.settings import configure_logging

    configure_logging("native")
    cid = channel("app", "stub")
    window = bookkeeping_module.BOOKKEEPING_SECONDS
    rates: dict[float, list[float]] = {window: [], 0.0: []}
    for _ in range(args.rounds):
        for each in (0.0, window):
            rates[each].append(_drain(cid, args.rows, args.batch_size, each))
    every, shipped = statistics.median(rates[0.0]), statistics.median(rates[window])
    print(
        table(
            ["bookkeeping", "rows/s (median)", "rounds"],
            [
                ["after every tick", f"{every:,.0f}", ", ".join(f"{r:,.0f}" for r in rates[0.0])],
                [
                    f"at most every {window:g} s (shipped)",
                    f"{shipped:,.0f}",
                    ", ".join(f"{r:,.0f}" for r in rates[window]),
                ],
            ],
        )
    )
    print(f"shipped / after every tick: {shipped / every:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bookkeeping", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--server", choices=["private", "url"], default="url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_bookkeeping_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
