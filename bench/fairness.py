"""``python -m bench.fairness`` (``make fairness-bench``): how late a small tenant's rows are sent while
another tenant's backlog drains.

A looping ``retry_worker`` drains tenant A's ``--a-rows`` due webhook rows to a receiver
on 127.0.0.1 answering in ``--delay`` seconds. While A drains, tenant B's ``--b-rows`` rows are handed
over due now, one every ``--b-every`` seconds (a NOTIFY wakes the worker, as for a dispatcher's
hand-off). Lateness is each row's first arrival at the receiver minus the time it fell due. Claiming by
due time alone, B's rows would wait for the rest of A's backlog: the drain's length is printed beside
them.

The claim's cost with tenants, at 100 k and 5 M rows, is ``python -m bench.run --only claim --scale``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

from bench.cluster import run_on_server
from bench.crash_worker import LoopingWorker
from bench.db import (
    TABLE,
    bench_dbname,
    connect,
    recreate_database,
    setup_django,
)
from bench.lateness import _quantile, _ticked, _wait_for
from bench.receiver import Sink, webhook_channel
from bench.report import table

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)

_BACKLOG = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, last_error, error_kind, attempt_log, dead_letter_reason, resolution,
    requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), %(tenant)s, %(channel)s, 'user' || g || '@example.com',
       '{{"subject": "Hello"}}'::jsonb, '', 5, 'failed', 1, now(), 'HTTP 503', 'http_5xx', '[]'::jsonb,
       '', '', 0, '', now(), now()
FROM generate_series(1, %(rows)s) AS g
"""

# A dispatcher's hand-off: its own first attempt failed, the row is due for a retry now.
_HAND_OFF = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, last_error, error_kind, attempt_log, dead_letter_reason, resolution,
    requeue_count, correlation_id, created_at, updated_at)
VALUES (%(id)s, %(tenant)s, %(channel)s, 'user@example.com', '{{"subject": "Hello"}}'::jsonb, '', 5,
        'failed', 1, now(), 'HTTP 503', 'http_5xx', '[]'::jsonb, '', '', 0, '', now(), now())
RETURNING extract(epoch FROM next_attempt_at)
"""


def lateness(sink: Sink, args: argparse.Namespace) -> dict[str, object]:
    """B's rows' lateness (seconds) while A's backlog drains, and the drain's length."""
    cid = webhook_channel(sink, max_concurrency=args.concurrency)
    worker = LoopingWorker(["--batch-size", "100000", "--max-duration", "60"])
    try:
        if not _wait_for(_ticked, 60):
            raise RuntimeError(f"the worker completed no tick:\n{worker.output_tail()}")
        sink.reset()
        due_b: dict[str, float] = {}
        with connect(autocommit=True) as conn:
            started = time.time()
            conn.execute(_BACKLOG, {"tenant": A, "channel": cid, "rows": args.a_rows})
            for i in range(args.b_rows):
                pause = started + args.b_start + i * args.b_every - time.time()
                if pause > 0:
                    time.sleep(pause)
                key = str(uuid.uuid4())
                row = conn.execute(_HAND_OFF, {"id": key, "tenant": B, "channel": cid}).fetchone()
                assert row is not None
                due_b[key] = float(row[0])
        total = args.a_rows + args.b_rows
        if not _wait_for(lambda: len(sink.first_arrivals()) >= total, args.a_rows / 50 + 120):
            raise RuntimeError(f"only {len(sink.first_arrivals())} of {total} rows arrived")
    finally:
        worker.stop()
    first = sink.first_arrivals()
    missing = [k for k in due_b if k not in first]
    if missing:
        raise RuntimeError(f"{len(missing)} of B's rows never arrived")
    a_arrivals = sorted(t for k, t in first.items() if k not in due_b)
    return {
        "late": [first[k] - at for k, at in due_b.items()],
        "drain_s": a_arrivals[-1] - started,
        "a_left_at_last_b": sum(1 for t in a_arrivals if t > max(due_b.values())),
    }


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry fairness benchmark — database {bench_dbname()!r}; {os.cpu_count()} CPUs; "
        f"tenant A: {args.a_rows:,} due rows; tenant B: {args.b_rows} rows handed over due now, one every "
        f"{args.b_every:g} s from {args.b_start:g} s on; receiver answers in {args.delay * 1000:g} ms; "
        f"channel max_concurrency {args.concurrency}"
    )
    recreate_database()
    setup_django()
    missed: list[str] = []
    sink = Sink(args.delay)
    try:
        result = lateness(sink, args)
    finally:
        sink.stop()
    late = result["late"]
    assert isinstance(late, list)
    p50, p99 = _quantile(late, 0.5), _quantile(late, 0.99)
    print(
        "\n"
        + table(
            ["lateness", "p50 ms", "p99 ms", "max ms"],
            [[f"tenant B ({len(late)} rows)", *(f"{v * 1000:,.0f}" for v in (p50, p99, max(late)))]],
        )
    )
    print(
        f"tenant A's drain took {result['drain_s']:.1f} s; {result['a_left_at_last_b']:,} of A's rows "
        "arrived after B's last row fell due (by due time alone, B's rows would have waited for them)"
    )
    if p99 > 1.0:
        missed.append("lateness p99 <= 1 s")
    print("\nTargets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=description)
    parser.add_argument("--a-rows", type=int, default=20_000, help="Tenant A's due rows (the backlog).")
    parser.add_argument("--b-rows", type=int, default=20, help="Tenant B's rows, handed over one by one.")
    parser.add_argument("--b-every", type=float, default=0.25, help="Seconds between B's rows.")
    parser.add_argument("--b-start", type=float, default=1.0, help="Seconds after A's backlog B starts.")
    parser.add_argument("--delay", type=float, default=0.02, help="The receiver's answer time (s).")
    parser.add_argument("--concurrency", type=int, default=32, help="The channel's max_concurrency.")
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_fairness_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
