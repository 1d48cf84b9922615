"""``python -m bench.unreadable_times``: what finding rows with times Python cannot read costs.

On the benchmark database (``nr_unreadable_bench`` of the local server by default): ``--rows`` Failed
rows waiting for a retry (due over the last hour) beside as many Sent rows, then

1. the plans of the two passes of :mod:`notifications_retry.delivery.unreadable_times`, by ``EXPLAIN
   (ANALYZE, BUFFERS)`` (rolled back): the worker's (the two ends of the due index, run after its first
   tick and every minute) and housekeeping's (every row that is not Sent);
2. each pass as the worker and housekeeping run it, with nothing to find: median and worst of
   ``--repeat`` runs, one transaction each;
3. the same passes with ``--unreadable`` rows to set aside (a third each year 12000, 'infinity' and
   '-infinity', in ``next_attempt_at``): the time to set them all aside, their events included.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime

from bench.cluster import run_on_server
from bench.db import TABLE, add_rows, bench_dbname, channel, connect, recreate_database, setup_django
from bench.report import table

FAR = ["12000-01-01 00:00+00", "infinity", "-infinity"]


def explain(due_only: bool) -> tuple[list[str], float]:
    """The pass's plan (first lines) and its execution time in ms, rolled back."""
    from notifications_retry.delivery.unreadable_times import BATCH_ROWS, batch_query

    sql = batch_query(due_only=due_only).replace("%(limit)s", str(BATCH_ROWS))
    with connect() as conn:
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}").fetchall()
        conn.rollback()
    lines = [str(row[0]) for row in rows]
    ms = next(float(line.split()[2]) for line in lines if line.startswith("Execution Time"))
    return lines, ms


def timed(due_only: bool, repeat: int) -> list[float]:
    """Milliseconds of ``repeat`` runs of the pass, each to its end (every batch)."""
    from notifications_retry.delivery import unreadable_times

    times = []
    for _ in range(repeat):
        now = datetime.now(UTC)
        started = time.perf_counter()
        list(unreadable_times.due_ends(now) if due_only else unreadable_times.everywhere(now))
        times.append((time.perf_counter() - started) * 1000)
    return times


def plant(count: int) -> None:
    """``count`` waiting rows get a ``next_attempt_at`` Python cannot read."""
    with connect(autocommit=True) as conn:
        conn.execute(
            f"""UPDATE {TABLE} SET next_attempt_at = (%(far)s::text[])[1 + x.n %% 3]::timestamptz
            FROM (SELECT id, row_number() OVER () AS n FROM {TABLE}
                  WHERE status = 'failed' AND dead_lettered_at IS NULL LIMIT %(count)s) x
            WHERE {TABLE}.id = x.id""",
            {"far": FAR, "count": count},
        )


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry unreadable-times benchmark — database {bench_dbname()!r}; "
        f"{args.rows:,} waiting Failed rows beside {args.rows:,} Sent rows",
        flush=True,
    )
    recreate_database()
    setup_django()
    add_rows([channel("app", "in_app")], 2 * args.rows, due_every=2)
    results = []
    for due_only, name in ((True, "worker: due index's ends"), (False, "housekeeping: every unsent row")):
        lines, ms = explain(due_only)
        print(f"\n{name}: EXPLAIN ANALYZE {ms:.3f} ms")
        print("\n".join(f"  {line}" for line in lines))
        idle = timed(due_only, args.repeat)
        results.append([name, f"{ms:.3f}", f"{statistics.median(idle):.2f}", f"{max(idle):.2f}"])
    set_aside = []
    for due_only in (True, False):
        plant(args.unreadable)
        started = time.perf_counter()
        from notifications_retry.delivery import unreadable_times

        now = datetime.now(UTC)
        found = sum(unreadable_times.due_ends(now) if due_only else unreadable_times.everywhere(now))
        seconds = time.perf_counter() - started
        if found != args.unreadable:
            raise RuntimeError(f"set aside {found} of {args.unreadable} rows")
        set_aside.append(f"{seconds * 1000:.0f}")
    print()
    print(
        table(
            ["pass", "EXPLAIN ANALYZE ms", "idle run median ms", "idle run worst ms"],
            results,
        )
    )
    print(
        f"\nsetting aside {args.unreadable} rows (events included): worker's pass {set_aside[0]} ms, "
        f"housekeeping's {set_aside[1]} ms"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.unreadable_times", description=description)
    parser.add_argument("--rows", type=int, default=100_000, help="Waiting Failed rows (and as many Sent).")
    parser.add_argument("--repeat", type=int, default=50, help="Runs of each pass with nothing to find.")
    parser.add_argument("--unreadable", type=int, default=300, help="Rows to set aside, for each pass.")
    parser.add_argument("--server", choices=["private", "url"], default="url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_unreadable_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
