"""``python -m bench.run`` (``make bench``): throughput figures measured in one run, with their ratios.

Builds datasets in a dedicated database (``nr_bench`` on the server of DATABASE_URL, dropped and
recreated), then measures, each on an identical fresh dataset:

* the raw psycopg ceiling: claim + status update + outbox insert, 100 rows a transaction;
* the worker's drain with a no-op (in_app) provider;
* procrastinate's worker draining no-op jobs, when procrastinate is installed;
* a latency-bound drain: a webhook receiver answering in 20 ms over real HTTP on 127.0.0.1;
* a rate-limited drain, with the largest count of sends the receiver saw in any 1-second window;
* the claim's time at 100 k rows with 1 % due (and at 5 M rows with ``--scale``);
* the worker's RSS while draining 1 M rows (``--memory``).

Figures move between runs: compare only the ratios printed by one run.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
TABLE = "notifications_retry_notificationentity"
OUTBOX = "notifications_retry_outbox"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _conninfo(dbname: str | None = None) -> str:
    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    return pg_conninfo.make_conninfo(url, dbname=dbname) if dbname else url


def bench_dbname() -> str:
    """The benchmark database's name (never the server's default database)."""
    return os.environ.get("NR_BENCH_DATABASE_NAME", "nr_bench")


def recreate_database() -> None:
    """Drop and create the benchmark database, then migrate it."""
    name = bench_dbname()
    with psycopg.connect(_conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with psycopg.connect(_conninfo(name), autocommit=True) as conn:
        # Frequent autovacuum on the hot table, as docs/performance.md recommends.
        conn.execute(
            f"ALTER TABLE {TABLE} SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_analyze_scale_factor = 0.01)"
        )


_django_ready = False


def setup_django() -> None:
    """Configure Django with bench.settings (idempotent)."""
    global _django_ready
    if _django_ready:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ["NR_BENCH_DATABASE_NAME"] = bench_dbname()
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import django

    django.setup()
    _django_ready = True


# -- datasets --------------------------------------------------------------------------------------

_INSERT = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), (%(channels)s::bigint[])[1 + g %% %(nchannels)s::int],
       'user' || g || '@example.com', '{{"subject": "Hello", "body": "Your order shipped"}}'::jsonb, '',
       (ARRAY[0, 5, 9])[1 + g %% 3],
       CASE WHEN g %% %(every)s::int = 0 THEN 'failed' ELSE 'sent' END, 1,
       CASE WHEN g %% %(every)s::int = 0 THEN now() - interval '1 hour' + g * interval '1 microsecond' END,
       CASE WHEN g %% %(every)s::int = 0 THEN NULL ELSE 'old-' || g END,
       CASE WHEN g %% %(every)s::int = 0 THEN 'HTTP 503' ELSE '' END,
       CASE WHEN g %% %(every)s::int = 0 THEN 'http_5xx' ELSE '' END,
       '[]'::jsonb, '', '', 0, '', now() - interval '2 hours', now() - interval '2 hours'
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g
"""


def channel(key: str, provider_key: str = "in_app", **fields: Any) -> int:
    """Create or update a channel; returns its id."""
    from notifications_retry.models import ChannelConfig

    defaults = {
        "provider_key": provider_key,
        "is_enabled": True,
        "max_attempts": 5,
        "timeout_seconds": 5.0,
        "backoff_base_seconds": 60,
        "backoff_cap_seconds": 3600,
        "options": {},
        "max_concurrency": 10,
        "rate_limit_per_second": None,
        **fields,
    }
    obj, _ = ChannelConfig.objects.update_or_create(key=key, defaults=defaults)
    return int(obj.pk)


def reset_rows() -> None:
    """Empty the notification and outbox tables (TRUNCATE fires no row triggers)."""
    with psycopg.connect(_conninfo(bench_dbname()), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {OUTBOX}, notifications_retry_deadletteraction, {TABLE}")


def add_rows(
    channels: Sequence[int], total: int, *, due_every: int = 1, start: int = 1, chunk: int = 500_000
) -> None:
    """Insert ``total`` rows spread over ``channels``; every ``due_every``-th is a due Failed row."""
    with psycopg.connect(_conninfo(bench_dbname()), autocommit=True) as conn:
        lo = start
        while lo < start + total:
            hi = min(start + total - 1, lo + chunk - 1)
            conn.execute(
                _INSERT,
                {
                    "channels": list(channels),
                    "nchannels": len(channels),
                    "every": due_every,
                    "start": lo,
                    "stop": hi,
                },
            )
            lo = hi + 1
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute(f"VACUUM ANALYZE {OUTBOX}")


def due_count() -> int:
    with psycopg.connect(_conninfo(bench_dbname())) as conn:
        row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE due_at <= now()").fetchone()
        return int(row[0]) if row else 0


# -- the raw ceiling -------------------------------------------------------------------------------

_RAW_CLAIM = f"""
SELECT id, tenant_id, attempts, requeue_count FROM {TABLE}
WHERE due_at IS NOT NULL AND due_at <= now()
ORDER BY due_at, priority LIMIT %s FOR UPDATE SKIP LOCKED
"""
_RAW_UPDATE = f"""
UPDATE {TABLE} t SET status = 'sent', attempts = t.attempts + 1, provider_message_id = v.pmid,
    last_error = '', error_kind = '', claim_token = NULL, claim_expires_at = NULL, updated_at = now(),
    attempt_log = t.attempt_log || jsonb_build_array(v.log::jsonb)
FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS v(id, pmid, log) WHERE t.id = v.id
"""
_RAW_OUTBOX = f"""
INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at)
SELECT v.event_id, 'pin.notifications.dispatched.v1', v.key, 1, v.generation, v.payload::jsonb, now()
FROM unnest(%s::uuid[], %s::text[], %s::int[], %s::text[]) AS v(event_id, key, generation, payload)
"""


def raw_drain(batch: int = 100) -> int:
    """Drain every due row with raw psycopg, ``batch`` rows a transaction; returns rows done."""
    done = 0
    with psycopg.connect(_conninfo(bench_dbname())) as conn:
        while True:
            with conn.transaction():
                rows = conn.execute(_RAW_CLAIM, (batch,)).fetchall()
                if not rows:
                    break
                now = datetime.now(UTC).isoformat()
                ids = [r[0] for r in rows]
                pmids = [f"raw:{r[0]}" for r in rows]
                logs = [json.dumps({"attempt": r[2] + 1, "at": now, "outcome": "sent"}) for r in rows]
                conn.execute(_RAW_UPDATE, (ids, pmids, logs))
                payloads = [
                    json.dumps(
                        {
                            "notification_id": str(r[0]),
                            "tenant_id": str(r[1]),
                            "channel": "in_app",
                            "status": "Sent",
                            "attempts": r[2] + 1,
                            "provider_message_id": f"raw:{r[0]}",
                            "error": None,
                            "error_kind": None,
                            "occurred_at": now,
                            "contract_version": 1,
                        }
                    )
                    for r in rows
                ]
                conn.execute(
                    _RAW_OUTBOX,
                    ([uuid.uuid4() for _ in rows], [str(r[0]) for r in rows], [r[3] for r in rows], payloads),
                )
            done += len(rows)
    return done


# -- the worker ------------------------------------------------------------------------------------


def worker_drain(expected: int, lane: str | None = None) -> dict[str, Any]:
    """One worker tick that drains everything due; returns its stats."""
    from django.db import connection

    from notifications_retry.engine.worker import Worker

    connection.close()
    worker = Worker(batch_size=expected + 1000, max_duration=3600, interval=0, lane=lane)
    try:
        stats = worker.tick()
    finally:
        worker.close()
    return stats.as_dict()


# -- procrastinate ---------------------------------------------------------------------------------


def procrastinate_drain(jobs: int, concurrency: int) -> float | None:
    """Defer ``jobs`` no-op jobs, then time procrastinate's worker draining them; None if not installed."""
    try:
        import procrastinate
    except ImportError:
        return None
    import logging

    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=_conninfo(bench_dbname())))

    @app.task(queue="bench", name="bench.noop")
    def noop(i: int) -> None:
        return None

    with app.open():
        with psycopg.connect(_conninfo(bench_dbname()), autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            if exists and exists[0]:
                conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        if not (exists and exists[0]):
            app.schema_manager.apply_schema()
        for lo in range(0, jobs, 1000):
            noop.batch_defer(*({"i": i} for i in range(lo, min(jobs, lo + 1000))))
    started = time.perf_counter()
    app.run_worker(queues=["bench"], concurrency=concurrency, wait=False, install_signal_handlers=False)
    elapsed = time.perf_counter() - started
    with psycopg.connect(_conninfo(bench_dbname())) as conn:
        row = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'").fetchone()
    finished = int(row[0]) if row else 0
    if finished != jobs:
        raise RuntimeError(f"procrastinate finished {finished} of {jobs} jobs")
    return jobs / elapsed


# -- HTTP ------------------------------------------------------------------------------------------


class Sink:
    """The benchmark's webhook receiver, in a subprocess."""

    def __init__(self, delay: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.sink", "--delay", str(delay)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self._client = None

    def _get(self, path: str) -> Any:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=30, trust_env=False).json()

    def reset(self) -> None:
        self._get("/reset")

    def stats(self) -> dict[str, Any]:
        """Arrival times (sorted) since the last reset, and the receiver's measured answer time."""
        stats: dict[str, Any] = self._get("/stats")
        stats["arrivals"] = sorted(stats["arrivals"])
        return stats

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def max_in_window(times: Sequence[float], window: float = 1.0) -> int:
    """The largest number of ``times`` inside any half-open window of ``window`` seconds."""
    best = 0
    for i, t in enumerate(times):
        best = max(best, bisect.bisect_left(times, t + window, lo=i) - i)
    return best


def http_drain(sink: Sink, rows: int, *, max_concurrency: int, rate: float | None) -> dict[str, Any]:
    """Drain ``rows`` due rows of a webhook channel pointed at ``sink``; rows/s and the window peak."""
    reset_rows()
    cid = channel(
        "hook",
        "webhook",
        options={"url": sink.url},
        max_concurrency=max_concurrency,
        rate_limit_per_second=rate,
        timeout_seconds=10.0,
    )
    add_rows([cid], rows)
    sink.reset()
    started, cpu_started = time.perf_counter(), time.process_time()
    stats = worker_drain(rows)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    received = sink.stats()
    arrivals = received["arrivals"]
    if stats["sent"] != rows:
        raise RuntimeError(f"webhook drain sent {stats['sent']} of {rows}: {stats}")
    span = (arrivals[-1] - arrivals[0]) if len(arrivals) > 1 else elapsed
    return {
        "rows_per_s": rows / elapsed,
        "cpu_ms_per_row": cpu * 1000 / rows,
        "cpu_share": cpu / elapsed,
        "send_rate": (len(arrivals) - 1) / span if span else 0.0,
        "max_per_1s_window": max_in_window(arrivals),
        "requests": len(arrivals),
        "answer_ms_mean": received["answer_ms_mean"],
    }


# -- claim time ------------------------------------------------------------------------------------


def claim_time(channels: Sequence[int], repeat: int = 30) -> float:
    """Median milliseconds of one tick's claim (100 rows over ``channels``), rolled back each time."""
    from django.db import connection, transaction

    from notifications_retry.delivery import ChannelClaim, claim_due

    budgets = {cid: (5, f"c{cid}") for cid in channels}
    plan = [ChannelClaim(cid, 100, 60.0) for cid in channels]
    times = []
    connection.close()
    for _ in range(repeat + 3):
        started = time.perf_counter()
        with transaction.atomic():
            batch = claim_due(datetime.now(UTC), plan, total=100, budgets=budgets)
            transaction.set_rollback(True)
        times.append((time.perf_counter() - started) * 1000)
        assert len(batch.records) == 100, len(batch.records)
    return statistics.median(times[3:])


def explain_claim(channels: Sequence[int]) -> str:
    """The claim's plan, as text (for the report)."""
    from django.db import connection

    from notifications_retry.delivery import ChannelClaim, claim_query

    plan = [ChannelClaim(cid, 100, 60.0) for cid in channels]
    sql, params = claim_query(datetime.now(UTC), plan, total=100)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) " + sql, params)
        return "\n".join(r[0] for r in cursor.fetchall())


# -- memory ----------------------------------------------------------------------------------------


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child_memory_drain(rows: int) -> None:
    """(In a subprocess) drain ``rows`` with one tick, sampling RSS; prints JSON."""
    setup_django()
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.perf_counter()
        while not done.wait(0.5):
            samples.append((time.perf_counter() - t0, _rss_mb()))

    sampler = threading.Thread(target=sample, daemon=True)
    before = _rss_mb()
    sampler.start()
    started = time.perf_counter()
    stats = worker_drain(rows)
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    rss = [s[1] for s in samples] or [_rss_mb()]
    tenth = max(1, len(rss) // 10)
    print(
        json.dumps(
            {
                "sent": stats["sent"],
                "seconds": elapsed,
                "rss_start_mb": before,
                "rss_after_10pct_mb": rss[tenth - 1],
                "rss_max_mb": max(rss),
                "rss_end_mb": rss[-1],
            }
        )
    )


# -- the run ---------------------------------------------------------------------------------------


def _median(fn: Callable[[], float], rounds: int) -> tuple[float, list[float]]:
    values = [fn() for _ in range(rounds)]
    return statistics.median(values), values


def _fmt(values: Sequence[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the figures and ratios."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="Due rows per drain (default 20000).")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per drain variant; medians reported.")
    parser.add_argument("--procrastinate-jobs", type=int, default=3000)
    parser.add_argument("--procrastinate-concurrency", type=int, default=10)
    parser.add_argument(
        "--latency-rows",
        type=int,
        default=None,
        help="rows per latency-bound drain (default: 300 per unit of max_concurrency, at least 3,000: "
        "about 6 s of sending, so a tick's start and end weigh little)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[10, 32],
        help="max_concurrency values for the latency-bound drain.",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="Rate limit (sends/s) for the rate figure.")
    parser.add_argument("--scale", action="store_true", help="Also measure the claim at 5 M rows (slow).")
    parser.add_argument(
        "--memory", action="store_true", help="Also measure RSS while draining 1 M rows (slow)."
    )
    parser.add_argument("--memory-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        choices=["drain", "latency", "rate", "claim", "memory"],
        help="Run only these parts.",
    )
    parser.add_argument("--child-memory-drain", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_memory_drain is not None:
        child_memory_drain(args.child_memory_drain)
        return 0

    parts = set(args.only or ["drain", "latency", "rate", "claim"])
    if args.memory:
        parts.add("memory")
    print(f"notifications_retry benchmark — database {bench_dbname()!r}, {os.cpu_count()} CPUs")
    recreate_database()
    setup_django()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        print(f"PostgreSQL {cursor.fetchone()[0]}")
    failed_targets: list[str] = []

    if "drain" in parts:
        cid = channel("in_app", "in_app")

        def raw_once() -> float:
            reset_rows()
            add_rows([cid], args.rows)
            started = time.perf_counter()
            done = raw_drain()
            rate = done / (time.perf_counter() - started)
            assert done == args.rows, done
            return rate

        def worker_once() -> float:
            reset_rows()
            add_rows([cid], args.rows)
            started = time.perf_counter()
            stats = worker_drain(args.rows)
            rate = stats["sent"] / (time.perf_counter() - started)
            assert stats["sent"] == args.rows, stats
            return rate

        raws, workers = [], []
        for _ in range(args.rounds):  # interleaved, so drift hits both alike
            raws.append(raw_once())
            workers.append(worker_once())
        raw, worker = statistics.median(raws), statistics.median(workers)
        print(f"\n## No-op drain, {args.rows:,} due rows, median of {args.rounds}")
        print(f"raw psycopg ceiling (100-row batches) : {raw:>9,.0f} rows/s   [{_fmt(raws)}]")
        print(f"worker (in_app provider)               : {worker:>9,.0f} rows/s   [{_fmt(workers)}]")
        ratio = worker / raw
        print(f"worker / raw ceiling                   : {ratio:>9.0%}      (target >= 40%)")
        if ratio < 0.40:
            failed_targets.append("worker/raw")
        reset_rows()
        proc = (
            procrastinate_drain(args.procrastinate_jobs, args.procrastinate_concurrency)
            if args.procrastinate_jobs > 0
            else None
        )
        if proc is None:
            print("procrastinate                          : not installed (pip install procrastinate)")
        else:
            print(
                f"procrastinate (concurrency {args.procrastinate_concurrency}, "
                f"{args.procrastinate_jobs:,} jobs) : {proc:>9,.0f} jobs/s"
            )
            print(f"worker / procrastinate                 : {worker / proc:>9.1f}x     (target >= 10x)")
            if worker / proc < 10:
                failed_targets.append("worker/procrastinate")

    sink = None
    try:
        if "latency" in parts or "rate" in parts:
            sink = Sink(0.02)
        if "latency" in parts:
            assert sink is not None
            from bench.settings import configure_logging

            print(
                "\n## Latency-bound drain: receiver answers in 20 ms over HTTP on 127.0.0.1\n"
                "Each concurrency twice: log events written by structlog itself (what docs/observability.md\n"
                "recommends for retry_worker processes; the target is checked on it), then routed through\n"
                "the stdlib logging module (the example project's configuration), to show what that costs."
            )
            for conc in args.concurrency:
                rows = args.latency_rows or max(3000, 300 * conc)
                for pipeline in ("native", "stdlib"):
                    configure_logging(pipeline)
                    result = http_drain(sink, rows, max_concurrency=conc, rate=None)
                    bound = conc / 0.02
                    ratio = result["rows_per_s"] / bound
                    print(
                        f"max_concurrency {conc:>3}, {rows:,} rows, {pipeline} logging: "
                        f"{result['rows_per_s']:>7,.0f} rows/s; bound min({conc}/20 ms, no limit) = "
                        f"{bound:,.0f}/s; ratio {ratio:.0%}"
                        + (" (target >= 80%)" if pipeline == "native" else "")
                        + f"; receiver answered in {result['answer_ms_mean']:.1f} ms on average; worker CPU "
                        f"{result['cpu_ms_per_row']:.2f} ms/row, {result['cpu_share']:.0%} of a core"
                    )
                    if pipeline == "native" and ratio < 0.8:
                        failed_targets.append(f"latency c={conc}")
                configure_logging("stdlib")
        if "rate" in parts:
            assert sink is not None
            rows = int(args.rate * 5)
            conc = 32
            result = http_drain(sink, rows, max_concurrency=conc, rate=args.rate)
            bound = min(conc / 0.02, args.rate)
            ratio = result["rows_per_s"] / bound
            over = result["max_per_1s_window"] / args.rate - 1
            print(
                f"\n## Rate-limited drain: rate_limit_per_second={args.rate:g}, max_concurrency {conc}, "
                f"{rows:,} rows"
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
                failed_targets.append("rate drain")
            if over > 0.05:
                failed_targets.append("rate window")
    finally:
        if sink is not None:
            sink.stop()

    if "claim" in parts:
        print("\n## Claim time (one tick's claim: 100 rows over 4 channels, rolled back), 1 % of rows due")
        reset_rows()
        cids = [channel(f"claim-{i}", "in_app") for i in range(4)]
        add_rows(cids, 100_000, due_every=100)
        small = claim_time(cids)
        print(f"100,000 rows   : {small:7.2f} ms")
        if args.scale:
            add_rows(cids, 4_900_000, due_every=100, start=100_001)
            large = claim_time(cids)
            print(f"5,000,000 rows : {large:7.2f} ms   ratio {large / small:.2f}x (target <= 1.5x)")
            if large / small > 1.5:
                failed_targets.append("claim scale")
        else:
            print("5,000,000 rows : skipped (run with --scale)")
        plan_text = explain_claim(cids)
        uses = "nr_channel_due_idx" in plan_text
        print(f"plan uses the partial index nr_channel_due_idx: {uses}")

    if "memory" in parts:
        print(f"\n## Memory while draining {args.memory_rows:,} due rows (one tick, in_app)")
        reset_rows()
        cid = channel("in_app", "in_app")
        add_rows([cid], args.memory_rows)
        child = [sys.executable, "-m", "bench.run", "--child-memory-drain", str(args.memory_rows)]
        out = subprocess.run(
            child,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "NR_BENCH_DATABASE_NAME": bench_dbname()},
        )
        m = json.loads(out.stdout.strip().splitlines()[-1])
        rate = m["sent"] / m["seconds"]
        print(
            f"sent {m['sent']:,} in {m['seconds']:.0f} s ({rate:,.0f} rows/s); RSS start "
            f"{m['rss_start_mb']:.0f} MB, after 10 % {m['rss_after_10pct_mb']:.0f} MB, max "
            f"{m['rss_max_mb']:.0f} MB, end {m['rss_end_mb']:.0f} MB (target < 150 MB)"
        )
        if m["rss_max_mb"] >= 150:
            failed_targets.append("memory")

    print("\nTargets missed: " + (", ".join(failed_targets) if failed_targets else "none"))
    return 1 if failed_targets else 0


if __name__ == "__main__":
    sys.exit(main())
