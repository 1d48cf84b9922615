"""``python -m bench.lateness`` (``make lateness-bench``): how late a looping worker sends, and what it
costs the database while nothing is due.

A looping ``retry_worker`` runs on its default settings (no ``--interval``: a tick every
``INTERVAL_SECONDS``) against a webhook receiver on 127.0.0.1 that answers at once.

1. Idle: once its first tick has completed, nothing is due for ``--idle`` seconds. The statements it
   runs meanwhile are counted with ``pg_stat_statements`` (its database only; the private cluster
   preloads the extension), and printed per second.
2. Lateness: ``--rows`` Pending notifications are scheduled evenly over ``--span`` seconds, all
   written up front (the worker's timer wakes it); as many again are handed over due now at the same
   moments, each written then (a NOTIFY wakes it, as for a dispatcher's hand-off or "retry now").
   Lateness is each row's first arrival at the receiver minus the time it fell due.

Printed: statements a second while idle, and lateness p50 / p95 / p99 / max of each kind of row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime

from bench.cluster import run_on_server
from bench.crash_worker import LoopingWorker
from bench.db import TABLE, bench_dbname, connect, recreate_database, setup_django
from bench.receiver import Sink, webhook_channel
from bench.report import table

_SCHEDULE = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, scheduled_at, last_error, error_kind, attempt_log, dead_letter_reason, resolution,
    requeue_count, correlation_id, created_at, updated_at)
VALUES (%(id)s, NULL, %(channel)s, 'user@example.com', '{{"subject": "Hello"}}'::jsonb, '', 5, 'pending',
        0, %(at)s, '', '', '[]'::jsonb, '', '', 0, '', now(), now())
"""

# A dispatcher's hand-off: its own first attempt failed, the row is due for a retry now.
_HAND_OFF = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, last_error, error_kind, attempt_log, dead_letter_reason, resolution,
    requeue_count, correlation_id, created_at, updated_at)
VALUES (%(id)s, NULL, %(channel)s, 'user@example.com', '{{"subject": "Hello"}}'::jsonb, '', 5, 'failed',
        1, now(), 'HTTP 503', 'http_5xx', '[]'::jsonb, '', '', 0, '', now(), now())
RETURNING extract(epoch FROM next_attempt_at)
"""

_STATEMENTS = """
SELECT coalesce(sum(s.calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = %s AND s.query NOT ILIKE '%%pg_stat_statements%%'
"""


def _wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _ticked() -> bool:
    """The worker has completed a tick (its logs go nowhere: bench.settings)."""
    with connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM notifications_retry_workerheartbeat "
            "WHERE last_tick_completed_at IS NOT NULL"
        ).fetchone()
    return bool(row and row[0])


def idle_statements(seconds: float) -> float | None:
    """Statements a second the benchmark database ran over ``seconds`` (None: no pg_stat_statements)."""
    with connect(autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        except Exception as exc:  # not preloaded on the server of DATABASE_URL
            print(f"pg_stat_statements unavailable ({type(exc).__name__}): idle statements not measured")
            return None
        time.sleep(seconds)
        row = conn.execute(_STATEMENTS, (bench_dbname(),)).fetchone()
    return float(row[0]) / seconds if row else 0.0


def lateness(sink: Sink, channel: int, rows: int, span: float, timeout: float) -> dict[str, list[float]]:
    """Seconds from due to first arrival, for rows scheduled ahead and rows handed over due now."""
    sink.reset()
    step = span / rows
    start = time.time() + 2.0
    scheduled: dict[str, float] = {}
    with connect(autocommit=True) as conn:
        for i in range(rows):
            at = start + i * step + step / 2
            key = str(uuid.uuid4())
            conn.execute(_SCHEDULE, {"id": key, "channel": channel, "at": datetime.fromtimestamp(at, UTC)})
            scheduled[key] = at
        handed: dict[str, float] = {}
        for i in range(rows):
            pause = start + i * step - time.time()
            if pause > 0:
                time.sleep(pause)
            key = str(uuid.uuid4())
            row = conn.execute(_HAND_OFF, {"id": key, "channel": channel}).fetchone()
            assert row is not None
            handed[key] = float(row[0])
    everything = {**scheduled, **handed}
    if not _wait_for(lambda: len(sink.first_arrivals()) >= len(everything), timeout):
        raise RuntimeError(f"only {len(sink.first_arrivals())} of {len(everything)} rows arrived")
    first = sink.first_arrivals()
    return {
        "scheduled ahead": [first[k] - at for k, at in scheduled.items()],
        "handed over due now": [first[k] - at for k, at in handed.items()],
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry lateness benchmark — database {bench_dbname()!r}; a looping retry_worker on "
        f"default settings; {args.rows} rows scheduled over {args.span:g} s and {args.rows} handed over "
        f"due now; idle {args.idle:g} s"
    )
    recreate_database()
    setup_django()
    sink = Sink(0.0)
    worker: LoopingWorker | None = None
    try:
        channel = webhook_channel(sink, max_concurrency=10)
        worker = LoopingWorker([])
        if not _wait_for(_ticked, 60):
            raise RuntimeError(f"the worker completed no tick:\n{worker.output_tail()}")
        idle = idle_statements(args.idle)
        late = lateness(sink, channel, args.rows, args.span, args.span + 120)
    finally:
        if worker is not None:
            worker.stop()
        sink.stop()
    rows = [
        [
            kind,
            f"{len(values)}",
            *(f"{_quantile(values, q) * 1000:,.0f}" for q in (0.5, 0.95, 0.99)),
            f"{max(values) * 1000:,.0f}",
            f"{statistics.fmean(values) * 1000:,.0f}",
        ]
        for kind, values in late.items()
    ]
    print("\n" + table(["rows", "count", "p50 ms", "p95 ms", "p99 ms", "max ms", "mean ms"], rows))
    print(
        "\nStatements a second while nothing is due (pg_stat_statements, the worker's database): "
        + (f"{idle:.2f}" if idle is not None else "not measured")
    )
    every = [v for values in late.values() for v in values]
    missed = []
    if _quantile(every, 0.99) > 1.0:
        missed.append("lateness p99 <= 1 s")
    if idle is not None and idle > 1.0:
        missed.append("idle statements/s <= 1")
    print("Targets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.lateness", description=description)
    parser.add_argument("--rows", type=int, default=40, help="Rows of each kind.")
    parser.add_argument("--span", type=float, default=150.0, help="Seconds the rows fall due over.")
    parser.add_argument("--idle", type=float, default=60.0, help="Seconds of nothing due, counted.")
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_lateness_bench")
    preload = "shared_preload_libraries = 'pg_stat_statements'\n"
    return run_on_server(args.server, lambda: _measure(args), settings=preload)


if __name__ == "__main__":
    sys.exit(main())
