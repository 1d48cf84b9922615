"""``python -m bench.prune`` (``make bench-prune``): the retention of Sent rows at 1,000,000 rows, and its
cost to the claim.

In one run, on the benchmark database (``nr_prune_bench`` of the local server by default):

1. ``--rows`` Sent rows last written 40 days ago (a tenth with an ESP's delivery status, which goes with
   them), beside a backlog of ``--due`` due rows on another channel;
2. the claim alone: a tick's claim (100 rows, rolled back) repeated for ``--window`` seconds; its
   median and p99;
3. the prune (``delivery.retention.prune_sent``, 30 days, in its own process, as housekeeping runs it)
   beside the same claims: its rows deleted a second, and the claim's median and p99 while it runs;
   then the claim alone again for ``--window`` seconds (the machine's load moves: the two windows
   around the prune show how much);
4. the same prune alone, on the rows seeded again: rows deleted a second;
5. a pass that finds nothing to delete (every Sent row younger than the retention): what an hourly run
   costs once the table is pruned, seconds per pass and rows walked a second;
6. the outbox gauges' reading (``Outbox.objects.backlog``, what every worker runs each
   10 s) with ``--unpublished`` events waiting among ``--rows`` published ones.

Figures move between runs and machines: compare the claim's figures of one run with each other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

from bench.cluster import run_on_server
from bench.db import ROOT, TABLE, add_rows, bench_dbname, channel, connect, recreate_database, setup_django
from bench.report import table

#: Sent rows last written 40 days ago: older than the 30-day retention the prune uses.
SEED_SENT = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), %(channel)s, 'user' || g || '@example.com',
       '{{"subject": "Hello", "body": "Your order shipped"}}'::jsonb, '', 5, 'sent', 1, NULL, 'm-' || g,
       '', '',
       '[{{"attempt": 1, "status_code": 200, "duration_ms": 41, "trigger": "scheduled"}}]'::jsonb, '', '', 0,
       '', now() - %(age)s::interval, now() - %(age)s::interval
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g
"""
SEED_STATUSES = f"""
INSERT INTO notifications_retry_deliverystatus (notification_id, state, state_at, esp, updated_at)
SELECT id, 'delivered', updated_at, 'bench', updated_at FROM {TABLE}
WHERE status = 'sent' AND right(provider_message_id, 1) = '0'
"""
RETENTION_DAYS = 30
#: Outbox rows written straight (the insert trigger checks each event against its notification: off, as
#: replication would apply them), published but the last ``unpublished``.
SEED_OUTBOX = """
INSERT INTO notifications_retry_outbox (event_id, topic, key, contract_version, generation, payload,
    created_at, published_at)
SELECT gen_random_uuid(), 'pin.notifications.dispatched.v1', gen_random_uuid()::text, 1, 0,
       '{"status": "Sent"}'::jsonb, now() - interval '1 hour' + g * interval '1 ms',
       CASE WHEN g > %(published)s THEN NULL ELSE now() END
FROM generate_series(1, %(total)s) AS g
"""


def seed_sent(sent_channel: int, rows: int, *, age: str = "40 days", chunk: int = 250_000) -> None:
    """Empty the Sent rows, then ``rows`` of them written ``age`` ago (a tenth with a delivery status)."""
    with connect(autocommit=True) as conn:
        conn.execute("TRUNCATE notifications_retry_deliverystatus")
        conn.execute(f"DELETE FROM {TABLE} WHERE status = 'sent'")
        start = 1
        while start <= rows:
            stop = min(rows, start + chunk - 1)
            conn.execute(SEED_SENT, {"channel": sent_channel, "start": start, "stop": stop, "age": age})
            start = stop + 1
        conn.execute(SEED_STATUSES)
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute("VACUUM ANALYZE notifications_retry_deliverystatus")


def sent_rows() -> int:
    with connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'sent'").fetchone()
        return int(row[0]) if row else 0


def claim_times(
    due_channel: int, seconds: float, until: subprocess.Popen[bytes] | None = None
) -> list[float]:
    """Milliseconds of a tick's claim (100 rows of ``due_channel``, rolled back), repeated for ``seconds``
    (or, with ``until``, as long as that process runs)."""
    from django.db import connection, transaction

    from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due

    budgets = {due_channel: (5, "due")}
    plan = [ChannelClaim(due_channel, 100, 60.0)]
    times: list[float] = []
    deadline = time.monotonic() + seconds
    connection.close()
    while (until.poll() is None) if until is not None else time.monotonic() < deadline:
        started = time.perf_counter()
        with transaction.atomic():
            batch = claim_due(ClaimRequest(datetime.now(UTC), plan, total=100, budgets=budgets))
            transaction.set_rollback(True)
        times.append((time.perf_counter() - started) * 1000)
        assert len(batch.records) == 100, len(batch.records)
    return times


def claim_row(name: str, times: list[float]) -> list[str]:
    return [name, f"{len(times)}", f"{statistics.median(times):.2f}", f"{p99(times):.2f}"]


def p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100)[98] if len(times) >= 100 else max(times)


def start_prune() -> subprocess.Popen[bytes]:
    """``python -m bench.prune --child``: the prune in a process of its own; its figures on stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.prune", "--child"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        stdout=subprocess.PIPE,
    )


def prune_figures(proc: subprocess.Popen[bytes]) -> dict[str, float]:
    out, _ = proc.communicate(timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"the prune exited {proc.returncode}")
    figures: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return figures


def gauge_reading_ms(published: int, unpublished: int, repeat: int = 50) -> float:
    """Median milliseconds of the outbox gauges' reading with ``unpublished`` events waiting."""
    from django.db import connection

    from notifications_retry.models import Outbox

    with connect(autocommit=True) as conn:
        conn.execute("TRUNCATE notifications_retry_outbox")
        conn.execute("SET session_replication_role = replica")
        conn.execute(SEED_OUTBOX, {"published": published, "total": published + unpublished})
        conn.execute("VACUUM ANALYZE notifications_retry_outbox")
    connection.close()
    times = []
    for _ in range(repeat + 3):
        started = time.perf_counter()
        backlog = Outbox.objects.backlog(datetime.now(UTC))
        times.append((time.perf_counter() - started) * 1000)
    assert backlog.unpublished == unpublished, backlog
    return statistics.median(times[3:])


def _child() -> int:
    """Run one pass of the prune; print rows deleted, rows walked and seconds as JSON."""
    setup_django()
    from notifications_retry.delivery.retention import SCAN_ROWS, prune_sent_batches

    older_than = datetime.now(UTC) - timedelta(days=RETENTION_DAYS)
    started = time.perf_counter()
    batches = list(prune_sent_batches(older_than=older_than))
    seconds = time.perf_counter() - started
    print(
        json.dumps({"deleted": sum(batches), "batches": len(batches), "scan": SCAN_ROWS, "seconds": seconds})
    )
    return 0


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry prune benchmark — database {bench_dbname()!r}; {args.rows:,} Sent rows 40 days "
        f"old, {args.due:,} due rows, a retention of {RETENTION_DAYS} days",
        flush=True,
    )
    recreate_database()
    setup_django()
    due_channel = channel("due", "in_app")
    sent_channel = channel("sent", "in_app")
    add_rows([due_channel], args.due)
    seed_sent(sent_channel, args.rows)
    print(f"seeded: {sent_rows():,} Sent rows", flush=True)

    alone = claim_times(due_channel, args.window)
    print(f"claim alone: {len(alone)} claims, p99 {p99(alone):.2f} ms", flush=True)

    proc = start_prune()
    beside = claim_times(due_channel, 0, until=proc)
    pruned = prune_figures(proc)
    beside_rate = pruned["deleted"] / pruned["seconds"]
    print(
        f"prune beside the claims: {pruned['deleted']:,.0f} rows in {pruned['seconds']:.1f} s; "
        f"claim p99 {p99(beside):.2f} ms over {len(beside)} claims",
        flush=True,
    )
    if sent_rows() != args.rows - pruned["deleted"] or pruned["deleted"] != args.rows:
        raise RuntimeError(f"the prune deleted {pruned['deleted']:,.0f} of {args.rows:,} rows")
    after = claim_times(due_channel, args.window)
    print(f"claim alone after it: {len(after)} claims, p99 {p99(after):.2f} ms", flush=True)

    seed_sent(sent_channel, args.rows)
    alone_prune = prune_figures(start_prune())
    alone_rate = alone_prune["deleted"] / alone_prune["seconds"]
    print(f"prune alone: {alone_prune['deleted']:,.0f} rows in {alone_prune['seconds']:.1f} s", flush=True)

    seed_sent(sent_channel, args.rows, age="1 day")  # younger than the retention: nothing to delete
    idle = prune_figures(start_prune())
    walked = args.rows + args.due
    print(f"a pass with nothing to delete: {idle['seconds']:.2f} s over {walked:,} rows", flush=True)

    gauges = [(n, gauge_reading_ms(args.rows, n)) for n in args.unpublished]

    print()
    print(
        table(
            ["claim (100 rows)", "claims", "median ms", "p99 ms"],
            [
                claim_row("alone, before", alone),
                claim_row("beside the prune", beside),
                claim_row("alone, after", after),
            ],
        )
    )
    print()
    print(
        table(
            ["prune of Sent rows", "rows", "seconds", "rows/s"],
            [
                [
                    "beside the claims",
                    f"{pruned['deleted']:,.0f}",
                    f"{pruned['seconds']:.1f}",
                    f"{beside_rate:,.0f}",
                ],
                [
                    "alone",
                    f"{alone_prune['deleted']:,.0f}",
                    f"{alone_prune['seconds']:.1f}",
                    f"{alone_rate:,.0f}",
                ],
                [
                    "a pass, nothing to delete",
                    f"{idle['deleted']:,.0f}",
                    f"{idle['seconds']:.2f}",
                    f"{walked / idle['seconds']:,.0f} walked",
                ],
            ],
        )
    )
    print(f"\nbatches of {pruned['scan']:,.0f} rows of the primary key; {pruned['batches']:,.0f} in the pass")
    print()
    print(
        table(
            ["outbox gauges' reading", "median ms"],
            [[f"{n:,} unpublished among {args.rows:,} published", f"{ms:.2f}"] for n, ms in gauges],
        )
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.prune", description=description)
    parser.add_argument("--rows", type=int, default=1_000_000, help="Sent rows older than the retention.")
    parser.add_argument("--due", type=int, default=10_000, help="Due rows the claims take (rolled back).")
    parser.add_argument("--window", type=float, default=20.0, help="Seconds the claim alone is measured.")
    parser.add_argument(
        "--unpublished",
        type=int,
        nargs="+",
        default=[0, 10_000, 100_000],
        help="Unpublished events for the gauges' reading (beside --rows published ones).",
    )
    parser.add_argument("--server", choices=["private", "url"], default="url")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_prune_bench")
    if args.child:
        return _child()
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
