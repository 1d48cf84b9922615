"""``python -m bench.schema_costs`` (``make schema-costs``): what the notification schema costs a drain.

The raw SQL drain (:mod:`bench.raw_drain`: 200-row batches of claim, mark Sent, outbox insert) on the
project's own table, in variants made by raw SQL in the benchmark database (the models and
migrations are untouched), each on a fresh dataset, interleaved over the rounds:

* ``as is``;
* ``triggers off``: every user trigger of the notification and outbox tables disabled;
* ``no admin-only indexes``: without the indexes only admin pages use (tenant, status + created,
  provider message id);
* ``also no nr_due_idx``: and without the global due index (the claim, like the worker's, is per
  channel and uses ``nr_channel_due_idx``);
* ``fillfactor 100 (PostgreSQL's default)``: no room kept on each page for an update's new row version
  (the table's own is 70, from migration 0008; on a table without one, the variant is ``fillfactor 70``);
* ``outbox trigger off``: the outbox insert without its per-row check against the notification;
* ``all of the above``.

Then the WAL of the drains split per relation with ``pg_waldump`` (lean, own table as is, the
worker's ``--once`` tick; then the lean leased drain and the worker's on a webhook), which says which
table or index each byte went to. Runs on a private cluster (WAL positions are cluster-wide; the
breakdown reads its WAL files).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections.abc import Callable

from bench import lean, raw_drain
from bench.ceiling import CeilingOptions
from bench.cluster import PrivateCluster, pg_bin
from bench.costs import Cost, ServerCpu, measure
from bench.db import OUTBOX, TABLE, add_rows, bench_dbname, channel, connect, recreate_database, reset_rows
from bench.receiver import Sink, webhook_channel
from bench.report import fmt_list, median_cost, table
from bench.wal_breakdown import FULL_PAGE_IMAGES, wal_by_relation
from bench.worker_drain import drain_once

ADMIN_ONLY_INDEXES = ("nr_status_created_idx", "nr_provider_message_idx", "%tenant_id%")
OUTBOX_CHECK_TRIGGER = "pgtrigger_nr_outbox_matches_outcome_%"
#: Calls in flight of the leased drains: bench.ceiling's.
LEASED_CONCURRENCY = CeilingOptions().leased_concurrency


@dataclasses.dataclass
class Variant:
    """A change to the schema: SQL statements to apply (before seeding) and to undo."""

    label: str
    apply: list[str]
    undo: list[str]


def _index_defs(patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    with connect() as conn:
        rows = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname LIKE ANY(%s)",
            (TABLE, list(patterns)),
        ).fetchall()
    return [(str(name), str(definition)) for name, definition in rows]


def _trigger_name(pattern: str) -> str:
    with connect() as conn:
        row = conn.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE %s", (pattern,)).fetchone()
    assert row is not None, f"no trigger like {pattern}"
    return str(row[0])


def _fillfactor() -> str | None:
    with connect() as conn:
        row = conn.execute(
            "SELECT o FROM pg_class c, unnest(c.reloptions) AS o "
            "WHERE c.relname = %s AND o LIKE 'fillfactor=%%'",
            (TABLE,),
        ).fetchone()
    return str(row[0]).split("=", 1)[1] if row else None


def variants() -> list[Variant]:
    admin = _index_defs(ADMIN_ONLY_INDEXES)
    due = _index_defs(("nr_due_idx",))
    check = _trigger_name(OUTBOX_CHECK_TRIGGER)
    triggers_off = [f"ALTER TABLE {TABLE} DISABLE TRIGGER USER", f"ALTER TABLE {OUTBOX} DISABLE TRIGGER USER"]
    triggers_on = [f"ALTER TABLE {TABLE} ENABLE TRIGGER USER", f"ALTER TABLE {OUTBOX} ENABLE TRIGGER USER"]
    drop_admin = [f'DROP INDEX "{name}"' for name, _ in admin]
    drop_due = [f'DROP INDEX "{name}"' for name, _ in due]
    # The variant is the fillfactor the table does not have: migration 0008 sets 70, so the variant is
    # PostgreSQL's default (a variant equal to "as is" would measure only noise). Undo restores the
    # table's own setting.
    own = _fillfactor()
    other = "100" if own and own != "100" else "70"
    ff_label = f"fillfactor {other}" + (" (PostgreSQL's default)" if other == "100" else "")
    ff_other, ff_reset = (
        [f"ALTER TABLE {TABLE} SET (fillfactor = {other})"],
        [
            f"ALTER TABLE {TABLE} SET (fillfactor = {own})"
            if own
            else f"ALTER TABLE {TABLE} RESET (fillfactor)"
        ],
    )
    return [
        Variant("as is", [], []),
        Variant("triggers off", triggers_off, triggers_on),
        Variant("no admin-only indexes", drop_admin, [d for _, d in admin]),
        Variant("also no nr_due_idx", drop_admin + drop_due, [d for _, d in admin + due]),
        Variant(ff_label, ff_other, ff_reset),
        Variant(
            "outbox trigger off",
            [f'ALTER TABLE {OUTBOX} DISABLE TRIGGER "{check}"'],
            [f'ALTER TABLE {OUTBOX} ENABLE TRIGGER "{check}"'],
        ),
        Variant(
            "all of the above",
            triggers_off + drop_admin + drop_due + ff_other,
            triggers_on + ff_reset + [d for _, d in admin + due],
        ),
    ]


def measure_variant(variant: Variant, rows: int, cid: int) -> Cost:
    reset_rows()
    # A fillfactor applies to pages written after it is set; the rest after seeding (the due_at
    # trigger computes the seeded rows' due_at).
    before = [s for s in variant.apply if "fillfactor" in s]
    with connect(autocommit=True) as conn:
        for statement in before:
            conn.execute(statement)
    try:
        add_rows([cid], rows)
        with connect(autocommit=True) as conn:
            for statement in variant.apply:
                if statement not in before:
                    conn.execute(statement)
        cpu = ServerCpu()
        cost = measure(variant.label, lambda: raw_drain.drain(cid, cpu=cpu))
        cost.server_cpu_s = cpu.seconds if cpu.known else None
    finally:
        with connect(autocommit=True) as conn:
            for statement in variant.undo:
                conn.execute(statement)
    if cost.rows != rows:
        raise RuntimeError(f"{variant.label}: drained {cost.rows} of {rows}")
    return cost


def breakdown(cluster: PrivateCluster | None, rows: int, cid: int, leased_rows: int = 3_000) -> str:
    """WAL per notification and relation for the lean drain, the own-table drain and the worker; with
    ``leased_rows``, also the lean leased drain and the worker's on a webhook (c=32, a receiver answering
    at once), as ``bench.ceiling`` measures them."""
    if cluster is None:
        return "(WAL per relation: only on the private cluster)"

    def seed() -> None:
        reset_rows()
        add_rows([cid], rows)

    drains: list[tuple[str, Callable[[], None], Callable[[], int]]] = [
        ("lean", lambda: lean.create(rows), lean.drain_inline),
        ("own table, raw SQL", seed, lambda: raw_drain.drain(cid)),
        ("worker (stub)", seed, lambda: drain_once(rows)),
    ]
    sink = Sink(0.0) if leased_rows else None
    per_drain: dict[str, dict[str, float]] = {}
    try:
        if sink is not None:
            hook = webhook_channel(sink, max_concurrency=LEASED_CONCURRENCY)
            send, close = lean.http_sender(sink.url, LEASED_CONCURRENCY)

            def seed_hook() -> None:
                reset_rows()
                add_rows([hook], leased_rows)

            drains += [
                (
                    "lean, leased",
                    lambda: lean.create(leased_rows),
                    lambda: lean.drain_leased(send, LEASED_CONCURRENCY),
                ),
                ("worker (webhook), leased", seed_hook, lambda: drain_once(leased_rows)),
            ]
        for label, prepare, drain in drains:
            prepare()
            cost = measure(label, drain)
            totals = wal_by_relation(cluster, cost.wal_range)
            per_drain[label] = {name: b / cost.rows for name, b in totals.items()}
            per_drain[label]["= measured by LSN"] = cost.wal_per_row
    finally:
        if sink is not None:
            close()
            sink.stop()
    special = {"= measured by LSN", FULL_PAGE_IMAGES}
    names = sorted(
        {n for d in per_drain.values() for n in d if n not in special},
        key=lambda n: -max(d.get(n, 0.0) for d in per_drain.values()),
    )
    rows_out = [
        [n, *(f"{d.get(n, 0.0):,.0f}" for d in per_drain.values())]
        for n in names
        if any(d.get(n, 0.0) >= 1 for d in per_drain.values())
    ]
    rows_out.append([FULL_PAGE_IMAGES, *(f"{d.get(FULL_PAGE_IMAGES, 0.0):,.0f}" for d in per_drain.values())])
    rows_out.append(["= total, by LSN", *(f"{d['= measured by LSN']:,.0f}" for d in per_drain.values())])
    return table(["WAL bytes per notification, by relation", *per_drain], rows_out)


def _measure(args: argparse.Namespace, cluster: PrivateCluster | None) -> int:
    print(f"notifications_retry schema costs — database {bench_dbname()!r}, {args.rows:,} due rows a drain")
    recreate_database()
    cid = channel("stub", "stub")
    if args.breakdown_only:
        print("\n## Where the bytes go (one drain each)")
        print(breakdown(cluster, args.rows, cid, args.leased_rows))
        return 0
    all_variants = variants()
    runs: dict[str, list[Cost]] = {}
    lean_runs: list[Cost] = []
    for _ in range(args.rounds):
        lean.create(args.rows)
        cpu = ServerCpu()
        lean_cost = measure("lean", functools.partial(lean.drain_inline, cpu))
        lean_cost.server_cpu_s = cpu.seconds if cpu.known else None
        lean_runs.append(lean_cost)
        for variant in all_variants:
            runs.setdefault(variant.label, []).append(measure_variant(variant, args.rows, cid))
    base = median_cost(runs["as is"])
    lean_median = median_cost(lean_runs)
    out = []
    for label, costs in [("lean ceiling (reference)", lean_runs), *runs.items()]:
        c = median_cost(costs)
        cpu_us, base_cpu = c.server_cpu_us_per_row, base.server_cpu_us_per_row
        out.append(
            [
                label,
                f"{cpu_us:,.0f}" if cpu_us is not None else "?",
                f"{cpu_us / base_cpu:.2f}" if cpu_us is not None and base_cpu else "?",
                f"{c.rows_per_s:,.0f}",
                f"{c.rows_per_s / base.rows_per_s:.2f}",
                f"{c.wal_per_row:,.0f}",
                f"{c.wal_per_row / base.wal_per_row:.2f}",
                f"{c.wal_per_row / lean_median.wal_per_row:.2f}x",
                f"[{fmt_list([x.rows_per_s for x in costs])}]",
            ]
        )
    header = [
        "raw SQL drain, own table",
        "server CPU µs/row",
        "vs as is",
        "rows/s",
        "vs as is",
        "WAL B/row",
        "vs as is",
        "vs lean",
        "rounds (rows/s)",
    ]
    print(f"\n## The raw drain on the project's table, by schema variant (median of {args.rounds})")
    print(
        "Server CPU: the drain's backend's user + system time from /proc (steadier than rows/s on a "
        "shared machine)."
    )
    print(table(header, out))
    print("\n## " + "Where the bytes go (one drain each)")
    print(breakdown(cluster, args.rows, cid, args.leased_rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.schema_costs", description=description)
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--leased-rows", type=int, default=3_000, help="Rows of the leased drains in the split (0: none)."
    )
    parser.add_argument(
        "--breakdown-only", action="store_true", help="Only the WAL split per relation (no variants)."
    )
    parser.add_argument("--server", choices=["private", "url"], default="private" if pg_bin() else "url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_bench_schema")
    if args.server == "url":
        return _measure(args, None)
    cluster = PrivateCluster().start()
    os.environ["DATABASE_URL"] = cluster.url
    try:
        return _measure(args, cluster)
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
