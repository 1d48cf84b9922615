"""``python -m bench.scale`` (``make bench-scale``): what adding workers buys, with ``PARTITIONS``.

Identical looping ``retry_worker`` processes (``PARTITIONS`` = 4 by default), driven only through the
command line, on a webhook channel whose receiver (``bench.sink``, its own process) answers in 50 ms
(``--receiver-ms``):

1. latency-bound drain: channel ``max_concurrency`` 64, each worker ``--max-in-flight 16``, so one
   worker's calls in flight bound its rate; rows/s with 1, 2 and 4 workers, and the ratios to 1 worker
   (same run). Rows/s is measured at the receiver, from the first request to the last. The workers are
   started and present (their presence locks listed in ``pg_locks``) before the rows are added.
2. duplicate sends: with 4 workers undisturbed, and with 4 workers of which one is SIGKILLed once a
   quarter of the rows are sent (its leases run out and its rows are sent again): duplicates against
   the rows it had leased (its calls in flight and the round queued behind them).
3. rate-limited channel (200/s total), 4 workers: the busiest 1-second window of arrivals.
   ``tenant``: the channel unlimited, ``TENANT_RATE_LIMITS`` 50/s for every tenant, the rows over 4
   tenants; with 1 and 4 workers, each tenant's busiest 1-second window (the limit is a total).
4. the claim's extra reading with N partitions: a claim of 200 rows owning one partition of N, at
   200,000 rows with 10 % due, its time and the rows its index scan read, against N = 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from bench.cluster import run_on_server
from bench.costs import backend_cpu_seconds
from bench.crash_worker import LoopingWorker
from bench.db import TABLE, add_rows, bench_dbname, connect, count_sent, recreate_database, reset_rows
from bench.receiver import Sink, max_in_window, webhook_channel
from bench.report import table

RECEIVER_DELAY = 0.05
LOOP = ["--interval", "1", "--batch-size", "100000", "--max-duration", "30"]
RATIO_TARGETS = {2: 1.8, 4: 3.2}
RATE = 200.0
RATE_TARGET = 1.05
TENANT_RATE, TENANTS = 50.0, 4

# The lane's presence: one shared advisory lock per live worker (database.locks).
_PRESENT = """
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock'
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# A worker's lock session (opened by its first tick), for a single partition, which has no presence lock.
_LOCK_SESSIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name = 'notifications_retry lock'
"""


def _present(partitions: int = 2) -> int:
    with connect() as conn:
        row = conn.execute(_PRESENT if partitions > 1 else _LOCK_SESSIONS).fetchone()
        return int(row[0]) if row else 0


def _leases() -> dict[str, str]:
    with connect() as conn:
        rows = conn.execute(f"SELECT id::text, claim_token::text FROM {TABLE} WHERE claim_token IS NOT NULL")
        return dict(rows.fetchall())


def start_workers(
    count: int, partitions: int, max_in_flight: int, timeout: float, extra: Mapping[str, Any] | None = None
) -> list[LoopingWorker]:
    settings = {"PARTITIONS": partitions, **(extra or {})}
    workers = [
        LoopingWorker([*LOOP, "--max-in-flight", str(max_in_flight)], settings=settings) for _ in range(count)
    ]
    if not wait_for(lambda: _present(partitions) >= count, timeout):
        tails = "\n".join(w.output_tail() for w in workers)
        for w in workers:
            w.kill()
        raise RuntimeError(f"{count} workers were not all present within {timeout:g} s:\n{tails}")
    return workers


def drain(
    sink: Sink,
    cid: int,
    *,
    workers: int,
    rows: int,
    partitions: int,
    max_in_flight: int,
    timeout: float,
    kill_one: bool = False,
    tenants: int = 0,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One drain of ``rows`` (over ``tenants``, 0: a tenant each) by ``workers`` looping workers (their
    ``settings`` added): rows/s at the receiver, duplicates, peak, and each tenant's peak."""
    reset_rows()
    sink.reset()
    procs = start_workers(workers, partitions, max_in_flight, timeout, settings)
    leased_by_victim = 0
    try:
        add_rows([cid], rows, tenants=tenants)
        if kill_one:
            if not wait_for(lambda: sink.count() >= rows // 4, timeout):
                raise RuntimeError("a quarter of the rows were not sent")
            victim = procs[0]
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
            at_kill = _leases()
            time.sleep(1.0)  # a survivor's call ends in 50 ms; the victim's leases stay until they run out
            leased_by_victim = sum(1 for nid, token in _leases().items() if at_kill.get(nid) == token)
        # The receiver's count first: asking the database every 50 ms (a connection and a count each
        # time) would add its own load to the drain's.
        started = time.monotonic()
        wait_for(lambda: sink.count() >= rows, timeout)
        if not wait_for(lambda: count_sent() >= rows, max(1.0, timeout - (time.monotonic() - started))):
            tails = "\n".join(w.output_tail() for w in procs)
            raise RuntimeError(f"the drain did not finish within {timeout:g} s:\n{tails}")
        cpu = sum(backend_cpu_seconds(w.proc.pid) or 0.0 for w in procs if w.alive())
    finally:
        for w in procs:
            w.stop()
    stats = sink.stats()
    arrivals = stats["arrivals"]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    keys = sink.keys()
    return {
        "rows_per_s": (len(arrivals) - 1) / span if span else 0.0,
        "duplicates": sum(n - 1 for n in keys.values()),
        "distinct": len(keys),
        "peak_1s": max_in_window(arrivals),
        "leased_by_victim": leased_by_victim,
        "answer_ms": stats["answer_ms_mean"],
        "worker_cpu_ms_per_row": cpu * 1000 / rows,
        "tenant_peaks": _tenant_peaks(sink) if tenants else [],
    }


def _tenant_peaks(sink: Sink) -> list[int]:
    """Each tenant's busiest 1-second window of first arrivals (the receiver keys them by row id)."""
    with connect() as conn:
        tenant_of = dict(conn.execute(f"SELECT id::text, tenant_id::text FROM {TABLE}").fetchall())
    arrivals: dict[str, list[float]] = {}
    for key, at in sink.first_arrivals().items():
        arrivals.setdefault(tenant_of[key], []).append(at)
    return sorted((max_in_window(times) for times in arrivals.values()), reverse=True)


def claim_reading(partition_counts: list[int], rows: int, due_every: int, repeat: int) -> list[list[str]]:
    """A 200-row claim owning one partition of N: median ms, rows its index scan read, against N = 1."""
    from django.db import connection, transaction

    from bench.db import channel
    from notifications_retry.delivery import ChannelClaim, ClaimRequest, Partitions, claim_due, claim_query

    reset_rows()
    cid = channel("in_app", "in_app")
    add_rows([cid], rows, due_every=due_every)
    plan = [ChannelClaim(cid, 200, 60.0)]
    out: list[list[str]] = []
    base = 0.0
    for n in partition_counts:
        owned = Partitions(n, (0,)) if n > 1 else None
        times = []
        connection.close()
        for _ in range(repeat + 3):
            started = time.perf_counter()
            with transaction.atomic():
                batch = claim_due(
                    ClaimRequest(
                        datetime.now(UTC), plan, total=200, budgets={cid: (5, "in_app")}, partitions=owned
                    )
                )
                transaction.set_rollback(True)
            times.append((time.perf_counter() - started) * 1000)
        median = statistics.median(times[3:])
        base = base or median
        sql, params = claim_query(datetime.now(UTC), plan, total=200, partitions=owned)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
            read, node = _rows_read(cursor.fetchone()[0])
            transaction.set_rollback(True)
        out.append(
            [f"{n}", f"{len(batch.records)}", f"{median:.2f}", f"{median / base:.2f}", f"{read:,}", node]
        )
    return out


def _rows_read(document: Any) -> tuple[int, str]:
    """Index entries the claim's scans on the table read (returned + removed by a filter, every loop),
    and the indexes they used."""
    import json

    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    stack, read, used = [plan], 0, set()
    while stack:
        node = stack.pop()
        if node.get("Relation Name") == TABLE:
            rows = int(node.get("Actual Rows", 0)) + int(node.get("Rows Removed by Filter", 0))
            read += rows * int(node.get("Actual Loops", 1))
            used.add(f"{node['Node Type']} on {node.get('Index Name')}")
        stack.extend(node.get("Plans", []))
    return read, "; ".join(sorted(used))


def _measure(args: argparse.Namespace) -> int:
    print(
        f"notifications_retry scale benchmark — database {bench_dbname()!r}; PARTITIONS {args.partitions}, "
        f"receiver answering in {args.receiver_ms:.0f} ms, {args.rows:,} rows per drain"
    )
    recreate_database()
    from bench.db import setup_django

    setup_django()
    from notifications_retry.models import ChannelConfig

    missed: list[str] = []
    sink = Sink(args.receiver_ms / 1000.0)
    try:
        cid = webhook_channel(sink, max_concurrency=64)
        # A short timeout makes a killed worker's leases short (a lease is a few timeouts plus a grace).
        ChannelConfig.objects.filter(pk=cid).update(timeout_seconds=1.0, max_attempts=100)
        common = {"partitions": args.partitions, "timeout": args.step_timeout}
        results = {}
        for count in args.workers:
            results[count] = drain(sink, cid, workers=count, rows=args.rows, max_in_flight=16, **common)
            print(f"{count} worker(s): {results[count]['rows_per_s']:,.0f} rows/s", flush=True)
        alone = drain(
            sink, cid, workers=1, rows=args.rows, max_in_flight=16, partitions=1, timeout=args.step_timeout
        )
        one = results[args.workers[0]]["rows_per_s"]
        lines = [
            [
                "1, PARTITIONS 1",
                f"{alone['rows_per_s']:,.0f}",
                f"{alone['rows_per_s'] / one if one else 0.0:.2f}",
                "—",
                f"{alone['duplicates']}",
                f"{alone['worker_cpu_ms_per_row']:.2f}",
            ]
        ]
        for count, r in results.items():
            ratio = r["rows_per_s"] / one if one else 0.0
            target = RATIO_TARGETS.get(count)
            if target and ratio < target:
                missed.append(f"{count} workers ÷ 1 = {ratio:.2f} < {target}")
            if r["duplicates"]:
                missed.append(f"{r['duplicates']} duplicate sends with {count} workers")
            lines.append(
                [
                    f"{count}",
                    f"{r['rows_per_s']:,.0f}",
                    f"{ratio:.2f}",
                    f"{target or '—'}",
                    f"{r['duplicates']}",
                    f"{r['worker_cpu_ms_per_row']:.2f}",
                ]
            )
        print("\nLatency-bound drain (max_concurrency 64, --max-in-flight 16 per worker):")
        header = ["workers", "rows/s", "÷ 1 worker", "target", "duplicate sends", "workers' CPU ms/row"]
        print(table(header, lines))
        print(f"({os.cpu_count()} CPUs, shared with PostgreSQL and the receiver)")

        if "kill" in args.parts:
            _kill_part(args, sink, cid, common, missed)
        if "rate" in args.parts:
            _rate_part(args, sink, cid, common, missed)
        if "tenant" in args.parts:
            _tenant_part(args, sink, cid, common, missed)
    finally:
        sink.stop()
    return _finish(args, missed)


def _kill_part(
    args: argparse.Namespace, sink: Sink, cid: int, common: dict[str, Any], missed: list[str]
) -> None:
    killed = drain(sink, cid, workers=4, rows=args.rows, max_in_flight=16, kill_one=True, **common)
    if killed["duplicates"] > killed["leased_by_victim"] or killed["distinct"] != args.rows:
        missed.append("duplicates after SIGKILL above the killed worker's leased rows, or rows lost")
    print("\n4 workers, one SIGKILLed after a quarter of the rows:")
    header = ["rows sent", "duplicate sends", "rows the killed worker had leased"]
    cells = [f"{killed['distinct']:,}", f"{killed['duplicates']}", f"{killed['leased_by_victim']}"]
    print(table(header, [cells]))


def _rate_part(
    args: argparse.Namespace, sink: Sink, cid: int, common: dict[str, Any], missed: list[str]
) -> None:
    from notifications_retry.models import ChannelConfig

    ChannelConfig.objects.filter(pk=cid).update(rate_limit_per_second=RATE)
    rate_rows = int(RATE * args.rate_seconds)
    peaks = []
    for count in (1, 4):
        r = drain(sink, cid, workers=count, rows=rate_rows, max_in_flight=16, **common)
        peaks.append([f"{count}", f"{r['peak_1s']}", f"{RATE * RATE_TARGET:.0f}", f"{r['rows_per_s']:,.0f}"])
        if r["peak_1s"] > RATE * RATE_TARGET:
            missed.append(f"busiest 1-s window {r['peak_1s']} with {count} workers")
    ChannelConfig.objects.filter(pk=cid).update(rate_limit_per_second=None)
    print(f"\nRate-limited channel ({RATE:.0f}/s in total), {rate_rows:,} rows:")
    print(table(["workers", "busiest 1-s window", "target ≤", "rows/s"], peaks))


def _tenant_part(
    args: argparse.Namespace, sink: Sink, cid: int, common: dict[str, Any], missed: list[str]
) -> None:
    rows = int(TENANT_RATE * TENANTS * args.rate_seconds)
    limits = {"TENANT_RATE_LIMITS": {"*": TENANT_RATE}}
    lines = []
    for count in (1, 4):
        r = drain(
            sink, cid, workers=count, rows=rows, max_in_flight=16, tenants=TENANTS, settings=limits, **common
        )
        peaks = r["tenant_peaks"]
        lines.append(
            [
                f"{count}",
                " / ".join(str(p) for p in peaks),
                f"{TENANT_RATE * RATE_TARGET:.0f}",
                f"{r['rows_per_s']:,.0f}",
                f"{TENANT_RATE * TENANTS:.0f}",
            ]
        )
        if max(peaks, default=0) > TENANT_RATE * RATE_TARGET:
            missed.append(f"a tenant's busiest 1-s window {max(peaks)} with {count} workers")
    print(f"\nTENANT_RATE_LIMITS {TENANT_RATE:.0f}/s for each of {TENANTS} tenants, {rows:,} rows:")
    print(
        table(["workers", "each tenant's busiest 1-s window", "target ≤", "rows/s", "the limits' sum"], lines)
    )


def _finish(args: argparse.Namespace, missed: list[str]) -> int:
    """The claim's reading with N partitions (unless left out), then the targets missed."""
    if "claim" not in args.parts:
        print("\nTargets missed: " + (", ".join(missed) if missed else "none"))
        return 1 if missed else 0
    print(f"\nClaim of 200 rows owning one partition of N ({args.claim_rows:,} rows, 1 in 10 due):")
    reading = claim_reading(args.claim_partitions, args.claim_rows, 10, args.repeat)
    print(
        table(["N", "rows claimed", "claim ms (median)", "÷ N = 1", "index entries read", "scans"], reading)
    )
    print("\nTargets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=description)
    parser.add_argument("--rows", type=int, default=6000, help="Due rows per drain.")
    parser.add_argument(
        "--receiver-ms",
        type=float,
        default=RECEIVER_DELAY * 1000,
        help="How long the receiver takes to answer (slower: scale-out where CPU is not the limit).",
    )
    parser.add_argument(
        "--parts",
        nargs="*",
        choices=["kill", "rate", "tenant", "claim"],
        default=["kill", "rate", "tenant", "claim"],
        help="Parts run after the latency-bound drain.",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate-seconds", type=float, default=10.0, help="Seconds of rows for the rate part.")
    parser.add_argument("--claim-rows", type=int, default=200_000)
    parser.add_argument("--claim-partitions", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--repeat", type=int, default=20, help="Claims timed per N.")
    parser.add_argument("--step-timeout", type=float, default=180.0, help="Longest wait for any one step.")
    parser.add_argument("--server", choices=["private", "url"], default="url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_scale_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
