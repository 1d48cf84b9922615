"""``python -m bench.recovery`` (``make bench-recovery``): a recovery job's rows/s and what it costs a drain.

In one run, on the benchmark database (``nr_recovery_bench`` of the local server by default):

1. the recovery alone: ``manage.py notifications_recover`` requeues ``--rows`` dead letters of a
   channel (disabled, so the requeued rows wait and add no sends to the drain); rows/s from the job's
   start to its end, as its row records them (the process's start-up left out);
2. for each ``--pauses`` value (the command's ``--pause`` between chunks): a looping ``retry_worker``
   drains a backlog of due rows on a no-op channel; its rows/s over ``--window`` seconds, then the same
   recovery is started beside it: the drain's rows/s while the job runs, and the job's.

Printed: the drain's rate with the job as a share of its rate just before (same worker, same backlog),
and the job's rate beside the drain as a share of its rate alone. Both sides are driven only through
their management commands.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.cluster import run_on_server
from bench.crash_worker import LoopingWorker, worker_env
from bench.db import (
    ROOT,
    TABLE,
    add_rows,
    bench_dbname,
    channel,
    connect,
    count_sent,
    recreate_database,
    setup_django,
)
from bench.report import table

SEED_DEAD_LETTERS = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, last_error, error_kind, attempt_log, dead_lettered_at, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), NULL, %(channel)s, 'user' || g || '@example.com',
       '{{"subject": "Hello", "body": "Your order shipped"}}'::jsonb, '', 5, 'failed', 5, NULL, 'HTTP 503',
       'http_5xx', '[]'::jsonb, timestamptz '2026-03-01 02:00+00' + g * interval '100 microseconds',
       'attempts exhausted', '', 0, '', now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, %(rows)s) AS g
"""
RECOVER = ["--channel", "outage", "--since", "2026-03-01T00:00Z", "--until", "2026-03-02T00:00Z"]


def reset(drain_channel: int, outage_channel: int, *, drain_rows: int, dead_letters: int) -> None:
    """Empty the tables, then a backlog of due rows on the drain channel and dead letters on the other."""
    with connect(autocommit=True) as conn:
        conn.execute(
            f"TRUNCATE notifications_retry_outbox, notifications_retry_deadletteraction, "
            f"notifications_retry_recoveryjob, {TABLE} CASCADE"  # and the rows that refer to them
        )
        if dead_letters:
            conn.execute(SEED_DEAD_LETTERS, {"channel": outage_channel, "rows": dead_letters})
    if drain_rows:
        add_rows([drain_channel], drain_rows)  # also VACUUM ANALYZEs the table
    else:
        with connect(autocommit=True) as conn:
            conn.execute(f"VACUUM ANALYZE {TABLE}")


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Recovery:
    """``notifications_recover`` over the outage window, as a subprocess (its output to a log file)."""

    def __init__(self, chunk_size: int, log_dir: Path, pause: float) -> None:
        self.log_path = log_dir / f"recover-{time.monotonic_ns()}.log"
        args = [*RECOVER, "--chunk-size", str(chunk_size), "--pause", str(pause)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "django", "notifications_recover", *args],
                env=worker_env(),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def wait_running(self, timeout: float) -> None:
        """Until the job has started (the process's start-up is not the recovery's time)."""
        if not wait_for(lambda: job_state() in ("running", "done") or self.proc.poll() is not None, timeout):
            raise RuntimeError("the recovery job never started")

    def wait(self, timeout: float) -> float:
        """The job's rows/s, from its start to its end as the job row records them."""
        code = self.proc.wait(timeout)
        if code != 0:
            raise RuntimeError(f"notifications_recover exited {code}:\n{self.log_path.read_text()[-2000:]}")
        with connect() as conn:
            sql = (
                "SELECT done, extract(epoch FROM finished_at - started_at) "
                "FROM notifications_retry_recoveryjob"
            )
            row = conn.execute(sql).fetchone()
        assert row is not None
        return float(row[0]) / float(row[1])


def job_state() -> str | None:
    with connect() as conn:
        row = conn.execute("SELECT state FROM notifications_retry_recoveryjob").fetchone()
        return str(row[0]) if row else None


def requeued() -> int:
    with connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE requeue_count > 0").fetchone()
        return int(row[0]) if row else 0


def together_run(
    args: argparse.Namespace, drain: int, outage: int, log_dir: Path, pause: float
) -> tuple[float, float, float, float]:
    """(pause, the drain's rows/s just before the job, while it runs, the job's rows/s): one worker.

    The drain's rate without the job is measured by the same worker over ``--window`` seconds right before
    the job starts, so the two drain figures share the worker, the backlog and the machine's load.
    """
    reset(drain, outage, drain_rows=args.drain_rows, dead_letters=args.rows)
    worker = LoopingWorker()
    try:
        if not wait_for(lambda: count_sent() > 0, args.timeout):
            raise RuntimeError(f"the worker sent nothing:\n{worker.output_tail()}")
        before, started = count_sent(), time.monotonic()
        time.sleep(args.window)
        drain_before = (count_sent() - before) / (time.monotonic() - started)
        recovery = Recovery(args.chunk_size, log_dir, pause)
        recovery.wait_running(args.timeout)
        before, started = count_sent(), time.monotonic()
        wait_for(lambda: job_state() != "running", args.timeout)
        drain_during = (count_sent() - before) / (time.monotonic() - started)
        recovery_rate = recovery.wait(args.timeout)
        if count_sent() >= args.drain_rows:
            print(
                "Note: the drain ran out of rows before the recovery ended: raise --drain-rows.", flush=True
            )
    finally:
        worker.stop()
    if requeued() != args.rows:
        raise RuntimeError(f"the recovery requeued {requeued():,} of {args.rows:,} rows")
    print(
        f"pause {pause:g} s: drain {drain_before:,.0f} rows/s before the job, {drain_during:,.0f} during it; "
        f"recovery {recovery_rate:,.0f} rows/s",
        flush=True,
    )
    return pause, drain_before, drain_during, recovery_rate


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry recovery benchmark — database {bench_dbname()!r}; {args.rows:,} dead letters, "
        f"chunks of {args.chunk_size}; a drain of {args.drain_rows:,} due rows on a no-op channel",
        flush=True,
    )
    recreate_database()
    setup_django()
    drain = channel("drain", "in_app", max_concurrency=32)
    outage = channel("outage", "in_app", is_enabled=False)

    log_dir = Path(tempfile.mkdtemp(prefix="nr-recovery-bench-"))
    reset(drain, outage, drain_rows=0, dead_letters=args.rows)
    alone = Recovery(args.chunk_size, log_dir, 0.0).wait(args.timeout)
    print(f"recovery alone: {alone:,.0f} rows/s", flush=True)

    rows = []
    for pause in args.pauses:
        _, drain_before, drain_during, recovered = together_run(args, drain, outage, log_dir, pause)
        rows.append(
            [
                f"{pause:g}",
                f"{drain_before:,.0f}",
                f"{drain_during:,.0f}",
                f"{drain_during / drain_before:.2f}" if drain_before else "-",
                f"{alone:,.0f}",
                f"{recovered:,.0f}",
                f"{recovered / alone:.2f}" if alone else "-",
            ]
        )
    header = [
        "pause s",
        "drain rows/s without",
        "with the job",
        "with / without",
        "recovery rows/s alone",
        "beside the drain",
        "beside / alone",
    ]
    print("\n" + table(header, rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=description)
    parser.add_argument("--rows", type=int, default=200_000, help="Dead letters to recover.")
    parser.add_argument("--chunk-size", type=int, default=500)
    parser.add_argument(
        "--pauses",
        type=float,
        nargs="+",
        default=[0.0],
        help="The recovery's --pause in each run beside the drain.",
    )
    parser.add_argument(
        "--drain-rows", type=int, default=1_000_000, help="Due rows of the drain (must outlast it)."
    )
    parser.add_argument(
        "--window", type=float, default=30.0, help="Seconds the drain alone is measured over."
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="Longest wait for any one step.")
    parser.add_argument("--server", choices=["private", "url"], default="url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_recovery_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
