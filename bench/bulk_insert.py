"""``python -m bench.bulk_insert``: what the wake-up trigger costs a bulk INSERT of due rows.

A monolith that bulk-schedules writes its rows in one statement (``bench.db.add_rows``: one
``INSERT … SELECT`` per 500,000 rows). Each row count is inserted on a fresh table with the wake-up
NOTIFY as shipped (once per statement, over the statement's new rows: migration 0017), with the
row-level trigger it replaced (the benchmark database migrated back to 0016 for that variant), and with
no wake-up trigger at all; seconds, and each against no trigger.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench.cluster import run_on_server
from bench.db import add_rows, bench_dbname, channel, recreate_database, reset_rows, setup_django
from bench.report import table

TABLE = "notifications_retry_notificationentity"
BEFORE = "0016_fair_claim_index"
SHIPPED = "per statement (shipped)"
ROW_LEVEL = "per row (migration 0015, before 0017)"
NONE = "no wake-up trigger"


def _insert(cid: int, rows: int, variant: str) -> float:
    """Seconds to insert ``rows`` due rows in one statement with ``variant``'s wake-up trigger."""
    from django.core.management import call_command
    from django.db import connection

    target = [BEFORE] if variant == ROW_LEVEL else []  # else the latest migration
    call_command("migrate", "notifications_retry", *target, verbosity=0)
    reset_rows()
    with connection.cursor() as cursor:
        cursor.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'pgtrigger_nr_wakeup_on_insert_%'")
        (trigger,) = cursor.fetchone()
        state = "DISABLE" if variant == NONE else "ENABLE"
        cursor.execute(f"ALTER TABLE {TABLE} {state} TRIGGER {trigger}")
    started = time.perf_counter()
    add_rows([cid], rows)
    return time.perf_counter() - started


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry bulk-insert benchmark — database {bench_dbname()!r}; one INSERT per row count"
    )
    recreate_database()
    setup_django()
    cid = channel("hook", "stub")
    lines = []
    for rows in args.rows:
        seconds = {variant: _insert(cid, rows, variant) for variant in (SHIPPED, ROW_LEVEL, NONE)}
        for variant, value in seconds.items():
            lines.append([f"{rows:,}", variant, f"{value:.2f}", f"{value / seconds[NONE]:.2f}"])
        print(f"{rows:,} rows done", flush=True)
    print(table(["rows", "wake-up trigger", "seconds", "÷ no trigger"], lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bulk_insert", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[20_000, 40_000, 100_000])
    parser.add_argument("--server", choices=["private", "url"], default="url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_bulk_insert_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
