"""The worker against the lean ceiling, in one run: rows/s, WAL bytes and commits per notification.

Drains measured, each on a fresh dataset, through :func:`bench.costs.measure`:

* inline (a provider without I/O): the lean drain, the same raw SQL on the project's own table, and
  the worker's ``retry_worker --once`` tick on a ``stub`` channel — interleaved over the rounds, so
  drift on a shared machine hits all three alike;
* leased (a webhook against the local receiver): the lean drain that leases, sends and then writes
  the outcome, and the worker's tick on a ``webhook`` channel;
* procrastinate and django-post_office, where installed.

The summary prints the ratios first (worker / lean), then each drain's figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from bench import competitors, lean, raw_drain
from bench.costs import Cost, measure
from bench.db import add_rows, channel, reset_rows
from bench.receiver import Sink, webhook_channel
from bench.report import COST_HEADER, cost_row, median_cost, table
from bench.worker_drain import drain_once

# Targets: worker rows/s at least this share of the lean drain's, WAL per
# notification at most these multiples of the lean drain's.
TARGET_RATE_SHARE = 0.30
TARGET_WAL_INLINE = 2.0
TARGET_WAL_LEASED = 2.5
TARGET_OVER_PROCRASTINATE = 10.0


@dataclasses.dataclass
class CeilingOptions:
    rows: int = 30_000
    leased_rows: int = 3_000
    leased_concurrency: int = 32
    rounds: int = 3
    competitor_jobs: int = 3_000
    procrastinate_concurrency: int = 10


@dataclasses.dataclass
class CeilingResult:
    inline: dict[str, Cost]
    inline_rates: dict[str, list[float]]
    leased: dict[str, Cost]
    others: list[Cost]


def _lean_inline(rows: int) -> Cost:
    lean.create(rows)
    return measure("lean, inline", lean.drain_inline)


def _own_table(rows: int, cid: int) -> Cost:
    reset_rows()
    add_rows([cid], rows)
    return measure("raw SQL on the own table, inline", lambda: raw_drain.drain(cid))


#: The inline drain's worker, by log pipeline: structlog writing its events itself is what
#: docs/observability.md recommends for retry_worker processes (the target is checked on it, as in the
#: latency-bound drain); through the stdlib logging module is what the example project's web processes do.
WORKER_INLINE = "worker (stub), inline"
WORKER_INLINE_STDLIB = "worker (stub), inline, stdlib logging"


def _worker_logged(pipeline: str, label: str, rows: int, cid: int) -> Cost:
    from bench.settings import configure_logging

    configure_logging(pipeline)
    try:
        return _worker(label, rows, cid)
    finally:
        configure_logging("stdlib")


def _worker(label: str, rows: int, cid: int) -> Cost:
    reset_rows()
    add_rows([cid], rows)
    cost = measure(label, lambda: drain_once(rows))
    if cost.rows != rows:
        raise RuntimeError(f"{label}: the worker sent {cost.rows} of {rows} rows")
    return cost


def run(options: CeilingOptions) -> CeilingResult:
    """Measure every drain; nothing is printed here."""
    stub = channel("stub", "stub")
    inline_runs: dict[str, list[Cost]] = {}
    for _ in range(options.rounds):
        for cost in (
            _lean_inline(options.rows),
            _own_table(options.rows, stub),
            _worker_logged("native", WORKER_INLINE, options.rows, stub),
            _worker_logged("stdlib", WORKER_INLINE_STDLIB, options.rows, stub),
        ):
            inline_runs.setdefault(cost.label, []).append(cost)
    inline = {label: median_cost(costs) for label, costs in inline_runs.items()}
    rates = {label: [c.rows_per_s for c in costs] for label, costs in inline_runs.items()}

    leased: dict[str, Cost] = {}
    sink = Sink(0.0)
    try:
        conc = options.leased_concurrency
        lean.create(options.leased_rows)
        send, close = lean.http_sender(sink.url, conc)
        try:
            leased["lean"] = measure("lean, leased (HTTP)", lambda: lean.drain_leased(send, conc))
        finally:
            close()
        hook = webhook_channel(sink, max_concurrency=conc)
        leased["worker"] = _worker(f"worker (webhook c={conc}), leased", options.leased_rows, hook)
    finally:
        sink.stop()

    others: list[Cost] = []
    reset_rows()
    prepared: list[tuple[str, Callable[[], int] | None]] = [
        (
            f"procrastinate (concurrency {options.procrastinate_concurrency})",
            competitors.prepare_procrastinate(options.competitor_jobs, options.procrastinate_concurrency)
            if options.competitor_jobs
            else None,
        ),
    ]
    for label, drain in prepared:
        if drain is not None:
            others.append(measure(label, drain))
    po = competitors.prepare_post_office(options.competitor_jobs) if options.competitor_jobs else None
    if po is not None:
        others.append(measure("django-post_office (send_queued_mail)", po))
    return CeilingResult(inline, rates, leased, others)


def report(result: CeilingResult, options: CeilingOptions) -> tuple[str, list[str]]:
    """The summary (ratios first, then the drains' figures) and the targets it missed."""
    lean_in = result.inline["lean, inline"]
    own = result.inline["raw SQL on the own table, inline"]
    worker_in = result.inline[WORKER_INLINE]
    worker_stdlib = result.inline[WORKER_INLINE_STDLIB]
    lean_ls, worker_ls = result.leased["lean"], result.leased["worker"]
    missed: list[str] = []

    def ratio_row(name: str, value: float, target: str, ok: bool | None, as_share: bool = False) -> list[str]:
        if ok is False:
            missed.append(name)
        verdict = "" if ok is None else ("met" if ok else "MISSED")
        return [name, f"{value:.2f}" if as_share else f"{value:.2f}x", target, verdict]

    rate_share = worker_in.rows_per_s / lean_in.rows_per_s
    wal_inline = worker_in.wal_per_row / lean_in.wal_per_row
    wal_leased = worker_ls.wal_per_row / lean_ls.wal_per_row
    ratios = [
        ratio_row(
            "worker / lean, rows/s (inline)",
            rate_share,
            f">= {TARGET_RATE_SHARE:.2f}",
            rate_share >= TARGET_RATE_SHARE,
            as_share=True,
        ),
        ratio_row(
            "worker / lean, rows/s (inline, stdlib logging)",
            worker_stdlib.rows_per_s / lean_in.rows_per_s,
            "",
            None,
            as_share=True,
        ),
        ratio_row(
            "worker / lean, WAL per notification (inline)",
            wal_inline,
            f"<= {TARGET_WAL_INLINE:.1f}x",
            wal_inline <= TARGET_WAL_INLINE,
        ),
        ratio_row(
            "worker / lean, WAL per notification (leased)",
            wal_leased,
            f"<= {TARGET_WAL_LEASED:.1f}x",
            wal_leased <= TARGET_WAL_LEASED,
        ),
        ratio_row(
            "worker / lean, commits per notification (inline)",
            worker_in.commits_per_row / lean_in.commits_per_row,
            "",
            None,
        ),
        ratio_row(
            "worker / lean, commits per notification (leased)",
            worker_ls.commits_per_row / lean_ls.commits_per_row,
            "",
            None,
        ),
        ratio_row("own-table raw SQL / lean, rows/s", own.rows_per_s / lean_in.rows_per_s, "", None, True),
        ratio_row(
            "own-table raw SQL / lean, WAL per notification", own.wal_per_row / lean_in.wal_per_row, "", None
        ),
        ratio_row(
            "worker / own-table raw SQL, rows/s", worker_in.rows_per_s / own.rows_per_s, "", None, True
        ),
    ]
    lean_cpu, worker_cpu = lean_in.cpu_us_per_row, worker_in.cpu_us_per_row
    if lean_cpu and worker_cpu:
        # What the rows/s share would be if both drains were CPU-bound: steady on a shared machine.
        ratios.insert(
            1,
            ratio_row("lean / worker, CPU per notification (inline)", lean_cpu / worker_cpu, "", None, True),
        )
    for other in result.others:
        name = other.label.split(" ")[0]
        ratio = worker_in.rows_per_s / other.rows_per_s
        # The earlier benchmark's target against procrastinate is kept; post_office is a reference.
        is_procrastinate = name == "procrastinate"
        target = f">= {TARGET_OVER_PROCRASTINATE:.0f}x" if is_procrastinate else ""
        ok = ratio >= TARGET_OVER_PROCRASTINATE if is_procrastinate else None
        ratios.append(ratio_row(f"worker / {name}, rows/s", ratio, target, ok))
    rows = [
        cost_row(c, result.inline_rates.get(c.label, ()))
        for c in (lean_in, own, worker_in, worker_stdlib, lean_ls, worker_ls, *result.others)
    ]
    text = "\n".join(
        [
            f"## Against the lean ceiling: {options.rows:,} due rows inline (median of {options.rounds}), "
            f"{options.leased_rows:,} leased",
            table(["ratio", "measured", "target", ""], ratios),
            "",
            table(COST_HEADER, rows),
            "WAL: pg_current_wal_lsn() around each drain, after a CHECKPOINT; commits: "
            "pg_stat_database.xact_commit delta. The worker's log events are written by structlog "
            "itself\n(docs/observability.md, for retry_worker processes) unless the drain says stdlib "
            "logging.",
        ]
    )
    return text, missed
