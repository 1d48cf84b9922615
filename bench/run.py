"""``python -m bench.run`` (``make bench``): throughput and write-cost figures measured in one run.

Builds datasets in a dedicated database (``nr_bench``, dropped and recreated) on a private PostgreSQL
cluster started for the run (``--server private``, the default when the server binaries are installed:
WAL positions are cluster-wide, so a shared server's other work would be counted), or on the server of
DATABASE_URL (``--server url``). Then measures, each on an identical fresh dataset:

* the worker against the lean ceiling: rows/s, WAL bytes and commits per notification, inline and
  leased, with the raw SQL drain on the project's own table, procrastinate and django-post_office;
* the no-op drain as a user runs it: ``manage.py retry_worker --once`` in its own process with the
  example project's settings, against the lean drain (:mod:`bench.command_drain`);
* a latency-bound drain: a webhook receiver answering in 20 ms over real HTTP on 127.0.0.1;
* a rate-limited drain, with the largest count of sends the receiver saw in any 1-second window;
* the claim's time at 100 k rows with 1 % due over 100 tenants (and at 5 M rows with ``--scale``);
* the worker's RSS while draining 1 M rows (``--memory``).

``--profile`` instead profiles a 30,000-row no-op drain and prints the top functions.
Figures move between runs: compare only the ratios printed by one run.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench import ceiling, claims, memory
from bench.cluster import pg_bin, run_on_server
from bench.db import (
    TABLE,
    add_rows,
    bench_dbname,
    channel,
    connect,
    recreate_database,
    reset_rows,
    setup_django,
)
from bench.engine_alone import sleep_drain
from bench.receiver import Sink, http_drain

PARTS = ["ceiling", "command", "latency", "rate", "claim", "memory"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=30_000, help="Due rows per inline drain (default 30000).")
    parser.add_argument(
        "--rounds", type=int, default=3, help="Rounds of the inline drains; medians reported."
    )
    parser.add_argument("--leased-rows", type=int, default=3_000, help="Due rows per leased drain.")
    parser.add_argument("--leased-concurrency", type=int, default=32)
    parser.add_argument(
        "--competitor-jobs",
        type=int,
        default=3000,
        help="Jobs / mails for procrastinate and post_office (0: skip).",
    )
    parser.add_argument("--procrastinate-concurrency", type=int, default=10)
    parser.add_argument(
        "--latency-rows",
        type=int,
        default=None,
        help="rows per latency-bound drain (default: 300 per unit of max_concurrency, at least 3,000: "
        "about 6 s of sending, so a tick's start and end weigh little)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 32])
    parser.add_argument("--rate", type=float, default=200.0, help="Rate limit (sends/s) for the rate figure.")
    parser.add_argument("--scale", action="store_true", help="Also measure the claim at 5 M rows (slow).")
    parser.add_argument(
        "--claim-tenants", type=int, default=100, help="Tenants the claim measurement's due rows belong to."
    )
    parser.add_argument(
        "--memory", action="store_true", help="Also measure RSS while draining 1 M rows (slow)."
    )
    parser.add_argument("--memory-rows", type=int, default=1_000_000)
    parser.add_argument("--only", nargs="+", default=None, choices=PARTS, help="Run only these parts.")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="Only profile a --profile-rows no-op drain; print the top functions.",
    )
    parser.add_argument("--profile-rows", type=int, default=30_000)
    parser.add_argument("--profiler", choices=["cprofile", "pyinstrument"], default="cprofile")
    parser.add_argument(
        "--profile-logging",
        choices=["stdlib", "native"],
        default="stdlib",
        help="Log pipeline of the profiled drain (bench.settings.configure_logging).",
    )
    parser.add_argument(
        "--server",
        choices=["private", "url"],
        default="private" if pg_bin() else "url",
        help="private: a throwaway cluster started for the run (default when PostgreSQL's binaries are "
        "installed); url: the server of DATABASE_URL (WAL figures then include its other sessions' writes).",
    )
    parser.add_argument(
        "--fillfactor",
        type=_fillfactor,
        default=None,
        help="The notification table's fillfactor for the run (migration 0008 sets 70): what an operator's "
        "own choice costs in WAL (docs/operations.md, Autovacuum).",
    )
    parser.add_argument("--child-memory-drain", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def _fillfactor(text: str) -> int:
    value = int(text)
    if not 10 <= value <= 100:
        raise argparse.ArgumentTypeError(f"a fillfactor is a percentage from 10 to 100, not {value}")
    return value


#: Targets: share of max_concurrency / latency at each concurrency (others: 0.8).
LATENCY_TARGETS = {32: 0.90, 128: 0.80}


def _client_alone(sink: Sink, concurrency: int, requests: int) -> dict[str, float]:
    """Requests/s and CPU µs a request of the bare aiohttp client against the same receiver: the
    ceiling of this machine for any worker that sends with it (no database, no scheduling, no logging),
    and the measure of its cores the worker's CPU a row is compared with."""
    import asyncio

    from bench.http_clients import aiohttp_client, drive

    return asyncio.run(drive(aiohttp_client, sink.url, requests, concurrency))


def _latency(sink: Sink, args: argparse.Namespace, missed: list[str]) -> None:
    from bench.settings import configure_logging

    print(
        "\n## Latency-bound drain: receiver answers in 20 ms over HTTP on 127.0.0.1\n"
        "Each concurrency: the bare aiohttp client alone against the same receiver (the ceiling: no\n"
        "database, no scheduling, no logging), then the worker with log events written by structlog\n"
        "itself (what docs/observability.md recommends for retry_worker processes; the target is\n"
        "checked on it, and what the example project's workers do), then routed through the stdlib\n"
        "logging module, to show what that costs; last, the engine alone: the same drain with a provider\n"
        "that waits 20 ms on the send loop instead of posting (bench.engine_alone)."
    )
    for conc in args.concurrency:
        rows = args.latency_rows or max(3000, 300 * conc)
        bound = conc / 0.02
        target = LATENCY_TARGETS.get(conc, 0.8)
        client = _client_alone(sink, conc, rows)
        ceiling = client["rps"]
        print(
            f"max_concurrency {conc:>3}, {rows:,} POSTs, aiohttp alone: {ceiling:>7,.0f} req/s; "
            f"ratio {ceiling / bound:.0%}; CPU {client['cpu_us']:.0f} µs/request"
        )
        for pipeline in ("native", "stdlib"):
            configure_logging(pipeline)
            result = http_drain(sink, rows, max_concurrency=conc, rate=None)
            ratio = result["rows_per_s"] / bound
            print(
                f"max_concurrency {conc:>3}, {rows:,} rows, {pipeline} logging: "
                f"{result['rows_per_s']:>7,.0f} rows/s; bound min({conc}/20 ms, no limit) = "
                f"{bound:,.0f}/s; ratio {ratio:.0%}"
                + (f" (target >= {target:.0%})" if pipeline == "native" else "")
                + f"; {result['rows_per_s'] / ceiling:.2f} of the client alone"
                + f"; receiver answered in {result['answer_ms_mean']:.1f} ms on average; worker CPU "
                f"{result['cpu_ms_per_row']:.2f} ms/row "
                f"({1000 * result['cpu_ms_per_row'] / client['cpu_us']:.1f}x the client's), "
                f"{result['cpu_share']:.0%} of a core{_core_wait(result['core_shares'])}"
            )
            if pipeline == "native" and ratio < target:
                missed.append(f"latency c={conc}")
        configure_logging("native")
        alone = sleep_drain(rows, max_concurrency=conc)
        print(
            f"max_concurrency {conc:>3}, {rows:,} rows, the engine alone (a provider that waits 20 ms, "
            f"no HTTP): {alone['rows_per_s']:>7,.0f} rows/s; ratio {alone['rows_per_s'] / bound:.0%}; "
            f"worker CPU {alone['cpu_us_per_row']:.0f} µs/row, {alone['cpu_share']:.0%} of a core"
            f"{_core_wait(alone['core_shares'])}"
        )
    configure_logging("stdlib")


def _core_wait(shares: tuple[float | None, float | None]) -> str:
    """The share of the drain the worker's thread was ready to run but waited for a core (Linux)."""
    waiting = shares[1]
    return "" if waiting is None else f", waited for a core {waiting:.0%} of the drain"


def _rate(sink: Sink, args: argparse.Namespace, missed: list[str]) -> None:
    rows, conc = int(args.rate * 5), 32
    result = http_drain(sink, rows, max_concurrency=conc, rate=args.rate)
    bound = min(conc / 0.02, args.rate)
    ratio = result["rows_per_s"] / bound
    over = result["max_per_1s_window"] / args.rate - 1
    print(
        f"\n## Rate-limited drain: rate_limit_per_second={args.rate:g}, max_concurrency {conc}, {rows:,} rows"
    )
    print(
        f"drain {result['rows_per_s']:,.0f} rows/s; bound min({conc}/20 ms, {args.rate:g}) = "
        f"{bound:,.0f}/s; ratio {ratio:.0%} (target >= 80%)"
    )
    print(
        f"most sends seen by the receiver in any 1-second window: {result['max_per_1s_window']} "
        f"({over:+.1%} vs the limit; target <= +5%)"
    )
    if ratio < 0.8:
        missed.append("rate drain")
    if over > 0.05:
        missed.append("rate window")


def _claim(args: argparse.Namespace, missed: list[str]) -> None:
    tenants = args.claim_tenants
    print(
        "\n## Claim time (one tick's claim: 100 rows over 4 channels, rolled back), 1 % of rows due, "
        f"the due rows spread over {tenants} tenants"
    )
    reset_rows()
    cids = [channel(f"claim-{i}", "stub") for i in range(4)]
    add_rows(cids, 100_000, due_every=100, tenants=tenants)
    small = claims.claim_time(cids)
    print(f"100,000 rows   : {small:7.2f} ms")
    if args.scale:
        add_rows(cids, 4_900_000, due_every=100, start=100_001, tenants=tenants)
        large = claims.claim_time(cids)
        print(f"5,000,000 rows : {large:7.2f} ms   ratio {large / small:.2f}x (target <= 1.5x)")
        if large / small > 1.5:
            missed.append("claim scale")
    else:
        print("5,000,000 rows : skipped (run with --scale)")
    uses = "nr_channel_tenant_due_idx" in claims.explain_claim(cids)
    print(f"plan walks the partial index nr_channel_tenant_due_idx: {uses}")
    # The walk over a channel's tenants is bounded (twice the claim's limit found, TENANTS_PER_CLAIM):
    # its cost with as many tenants as due rows.
    reset_rows()
    add_rows(cids, 100_000, due_every=100)
    print(f"100,000 rows, every due row a tenant of its own: {claims.claim_time(cids):7.2f} ms")


def _memory(args: argparse.Namespace, missed: list[str]) -> None:
    print(f"\n## Memory while draining {args.memory_rows:,} due rows (one tick, stub provider)")
    m = memory.memory_drain(args.memory_rows)
    print(
        f"sent {m['sent']:,} in {m['seconds']:.0f} s ({m['sent'] / m['seconds']:,.0f} rows/s); RSS start "
        f"{m['rss_start_mb']:.0f} MB, after 10 % {m['rss_after_10pct_mb']:.0f} MB, max "
        f"{m['rss_max_mb']:.0f} MB, end {m['rss_end_mb']:.0f} MB (target < 150 MB)"
    )
    if m["rss_max_mb"] >= 150:
        missed.append("memory")


def _measure(args: argparse.Namespace) -> int:
    parts = set(args.only or ["ceiling", "command", "latency", "rate", "claim"])
    if args.memory:
        parts.add("memory")
    print(f"notifications_retry benchmark — database {bench_dbname()!r}, {os.cpu_count()} CPUs")
    recreate_database()
    setup_django()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        row = cursor.fetchone()
        where = "a private cluster" if args.server == "private" else "the server of DATABASE_URL"
        print(f"PostgreSQL {row[0] if row else '?'} on {where}")
    if args.fillfactor is not None:
        # A reloption: it outlives the TRUNCATE before each drain, and applies to the rows seeded after it.
        with connect(autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {TABLE} SET (fillfactor = {args.fillfactor})")
        print(f"the notification table's fillfactor: {args.fillfactor} (migration 0008 sets 70)")
    if args.profile:
        from bench.profile import profile_drain

        print(profile_drain(args.profile_rows, args.profiler, logging=args.profile_logging))
        return 0
    missed: list[str] = []
    if "ceiling" in parts:
        options = ceiling.CeilingOptions(
            rows=args.rows,
            leased_rows=args.leased_rows,
            leased_concurrency=args.leased_concurrency,
            rounds=args.rounds,
            competitor_jobs=args.competitor_jobs,
            procrastinate_concurrency=args.procrastinate_concurrency,
        )
        text, ceiling_missed = ceiling.report(ceiling.run(options), options)
        print("\n" + text)
        missed += ceiling_missed
    if "command" in parts:
        from bench import command_drain

        text, share = command_drain.report(args.rows, args.rounds)
        print("\n" + text)
        if share < command_drain.TARGET:
            missed.append("command / lean, rows/s")
    sink = Sink(0.02) if parts & {"latency", "rate"} else None
    try:
        if sink is not None and "latency" in parts:
            _latency(sink, args, missed)
        if sink is not None and "rate" in parts:
            _rate(sink, args, missed)
    finally:
        if sink is not None:
            sink.stop()
    if "claim" in parts:
        _claim(args, missed)
    if "memory" in parts:
        _memory(args, missed)
    print("\nTargets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures and ratios."""
    args = _parser().parse_args(argv)
    if args.child_memory_drain is not None:
        memory.child_memory_drain(args.child_memory_drain)
        return 0
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
