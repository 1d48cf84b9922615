"""``python -m bench.wakeup_cut`` (``make wakeup-bench``): how late a looping worker sends a row due just
after its database sessions were cut while it waited between ticks.

A looping ``retry_worker`` runs on its default settings (a tick every ``INTERVAL_SECONDS``, 60 s) against
a webhook receiver on 127.0.0.1 that answers at once. Each trial waits until the worker is between ticks,
terminates every session of the benchmark database but its own (``pg_terminate_backend``, as a pooler's
idle cut or a failover ends them), and schedules one row due ``--due-in`` seconds later. Lateness is the
row's first arrival at the receiver minus the time it fell due.

Two scenarios, a fresh worker each: the cut alone, and the cut beside two rows in year 12000 (a retry and
a schedule, written by raw SQL: PostgreSQL stores them, psycopg cannot read them back).

Printed: lateness p50 and worst of each scenario over ``--trials`` trials, against the target (worst
<= 2 s). Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid

from bench.cluster import run_on_server
from bench.crash_worker import LoopingWorker
from bench.db import TABLE, bench_dbname, connect, recreate_database, setup_django
from bench.lateness import _ticked, _wait_for
from bench.receiver import Sink, webhook_channel
from bench.report import table
from notifications_retry.database.locks import LOCK_APPLICATION_NAME

#: The worst lateness the wake-up must keep to, cut or not.
TARGET_SECONDS = 2.0
#: How long a trial waits for its row before it calls the worker stuck (past a whole interval).
ARRIVAL_TIMEOUT = 120.0

_SCHEDULE = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, scheduled_at, last_error, error_kind, attempt_log, dead_letter_reason, resolution,
    requeue_count, correlation_id, created_at, updated_at)
VALUES (%(id)s, NULL, %(channel)s, 'user@example.com', '{{"subject": "Hello"}}'::jsonb, '', 5, 'pending',
        0, now() + %(due_in)s * interval '1 second', '', '', '[]'::jsonb, '', '', 0, '', now(), now())
RETURNING extract(epoch FROM scheduled_at)
"""

# A retry and a schedule in year 12000, as other code could write them.
_FAR_ROWS = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, scheduled_at, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
VALUES (gen_random_uuid(), NULL, %(channel)s, 'far@example.com', '{{"subject": "Hello"}}'::jsonb, '', 5,
        'failed', 1, '12000-01-01 00:00+00', NULL, '', 'http_5xx', '[]'::jsonb, '', '', 0, '', now(), now()),
       (gen_random_uuid(), NULL, %(channel)s, 'far@example.com', '{{"subject": "Hello"}}'::jsonb, '', 5,
        'pending', 0, NULL, '12000-01-01 00:00+00', '', '', '[]'::jsonb, '', '', 0, '', now(), now())
"""

# The worker waits between ticks: none of its sessions runs a statement or is inside a transaction, and
# its lock session, if open, last asked for the earliest due time (a tick ends by unlocking there; a
# worker that could not ask waits out its interval with the lock session closed).
_WAITING = """
SELECT NOT EXISTS (
    SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
    AND (state <> 'idle' OR (application_name = %(lock)s AND query NOT LIKE '%%due_at%%')))
"""

_CUT = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


def waiting() -> bool:
    """Whether the worker waits between ticks now (not inside a tick)."""
    with connect(autocommit=True) as conn:
        row = conn.execute(_WAITING, {"lock": LOCK_APPLICATION_NAME}).fetchone()
    return bool(row and row[0])


def trial(sink: Sink, channel: int, due_in: float, settle: float) -> float:
    """Cut the worker's sessions while it waits, schedule a row ``due_in`` s later: its lateness (s)."""
    time.sleep(settle)  # the last trial's tick has ended
    if not _wait_for(waiting, 60):
        raise RuntimeError("the worker was never seen waiting between ticks")
    key = str(uuid.uuid4())
    with connect(autocommit=True) as conn:
        row = conn.execute(_CUT).fetchone()
        if not row or not row[0]:
            raise RuntimeError("no session of the worker to terminate")
        due = conn.execute(_SCHEDULE, {"id": key, "channel": channel, "due_in": due_in}).fetchone()
    assert due is not None
    if not _wait_for(lambda: key in sink.first_arrivals(), due_in + ARRIVAL_TIMEOUT):
        raise RuntimeError(f"the row due {due_in:g} s after the cut never arrived")
    return sink.first_arrivals()[key] - float(due[0])


def scenario(sink: Sink, channel: int, args: argparse.Namespace, *, far: bool) -> list[float]:
    """Lateness of ``--trials`` trials on a fresh worker (beside year-12000 rows when ``far``)."""
    with connect(autocommit=True) as conn:
        if far:
            conn.execute(_FAR_ROWS, {"channel": channel})
        # The last scenario's worker completed ticks: this one's first is awaited afresh.
        conn.execute("DELETE FROM notifications_retry_workerheartbeat")
    worker = LoopingWorker([])
    try:
        if not _wait_for(_ticked, 60):
            raise RuntimeError(f"the worker completed no tick:\n{worker.output_tail()}")
        late = []
        for i in range(args.trials):
            late.append(trial(sink, channel, args.due_in, args.settle))
            if not worker.alive():
                raise RuntimeError(f"the worker exited:\n{worker.output_tail()}")
            name = "beside year 12000" if far else "cut"
            print(f"  {name}: trial {i + 1}/{args.trials}: {late[-1]:.3f} s late", flush=True)
        return late
    finally:
        worker.stop()


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry wake-up cut benchmark — database {bench_dbname()!r}; a looping retry_worker "
        f"on default settings; {args.trials} trials a scenario, a row due {args.due_in:g} s after each cut"
    )
    recreate_database()
    setup_django()
    sink = Sink(0.0)
    try:
        channel = webhook_channel(sink, max_concurrency=8)
        results = {
            "cut": scenario(sink, channel, args, far=False),
            "cut, beside year-12000 rows": scenario(sink, channel, args, far=True),
        }
    finally:
        sink.stop()
    rows = [
        [
            name,
            f"{len(late)}",
            f"{statistics.median(late) * 1000:,.0f}",
            f"{max(late) * 1000:,.0f}",
            f"<= {TARGET_SECONDS * 1000:,.0f}",
        ]
        for name, late in results.items()
    ]
    print(
        f"\nLateness of a row due {args.due_in:g} s after the worker's sessions were cut, default interval:\n"
    )
    print(table(["scenario", "trials", "p50 ms", "worst ms", "target ms"], rows))
    missed = [name for name, late in results.items() if max(late) > TARGET_SECONDS]
    print("Targets missed: " + (", ".join(f"worst <= {TARGET_SECONDS:g} s ({m})" for m in missed) or "none"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup_cut", description=description)
    parser.add_argument("--trials", type=int, default=20, help="Cuts per scenario.")
    parser.add_argument("--due-in", type=float, default=5.0, help="Seconds from a cut to its row's due time.")
    parser.add_argument(
        "--settle", type=float, default=1.5, help="Seconds between a row's arrival and the next cut."
    )
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_wakeup_cut_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
