"""``python -m bench.relay``: the outbox side, measured in one run, with ratios.

* the worker's drain (no-op provider) with the outbox-insert trigger ``nr_outbox_matches_outcome``
  enabled and disabled: what checking each event against its notification costs;
* the relay's throughput with the ``log`` publisher and with the ``http`` publisher against the
  benchmark's receiver on 127.0.0.1 (answering at once, in its own process).

Uses its own database (``nr_bench_relay`` unless NR_BENCH_DATABASE_NAME is set). Figures move between
runs: compare only the ratios printed by one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_bench_relay")

# The database name is chosen above, before bench.db reads it.
from bench.db import OUTBOX, add_rows, bench_dbname, channel, conninfo, recreate_database, reset_rows
from bench.receiver import Sink
from bench.worker_drain import drain_once

TRIGGER_LIKE = "pgtrigger_nr_outbox_matches_outcome_%"


def _set_trigger(enabled: bool) -> None:
    import psycopg

    with psycopg.connect(conninfo(bench_dbname()), autocommit=True) as conn:
        row = conn.execute("SELECT tgname FROM pg_trigger WHERE tgname LIKE %s", (TRIGGER_LIKE,)).fetchone()
        assert row is not None, "the outbox trigger is not installed"
        (name,) = row
        conn.execute(f'ALTER TABLE {OUTBOX} {"ENABLE" if enabled else "DISABLE"} TRIGGER "{name}"')


def drain_rate(rows: int, *, trigger: bool) -> float:
    reset_rows()
    cid = channel("in_app", "in_app")
    add_rows([cid], rows)
    _set_trigger(trigger)
    try:
        started = time.perf_counter()
        sent = drain_once(rows)
        elapsed = time.perf_counter() - started
    finally:
        _set_trigger(True)
    assert sent == rows, sent
    return rows / elapsed


def relay_rate(rows: int, publisher: str, url: str | None) -> float:
    from django.db import connection

    from notifications_retry.models import Outbox
    from notifications_retry.outbox.publishers import get_publisher
    from notifications_retry.outbox.relay import Relay
    from notifications_retry.runtime.clock import SystemClock

    reset_rows()
    cid = channel("in_app", "in_app")
    add_rows([cid], rows)
    drain_once(rows)  # the events to relay, written the real way
    connection.close()
    options = {"url": url} if url else {}
    relay = Relay(get_publisher(publisher, options), batch_size=100, interval=0.01, clock=SystemClock())
    started = time.perf_counter()
    relay.run(once=True)
    elapsed = time.perf_counter() - started
    assert not Outbox.objects.filter(published_at__isnull=True).exists()
    return rows / elapsed


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=20_000, help="rows drained per measurement")
    parser.add_argument("--relay-rows", type=int, default=5_000, help="events relayed per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    recreate_database()
    drain_rate(min(args.rows, 2000), trigger=True)  # warm-up: caches, JIT of the plans, connections
    with_trigger, without_trigger = [], []
    for _ in range(args.rounds):
        without_trigger.append(drain_rate(args.rows, trigger=False))
        with_trigger.append(drain_rate(args.rows, trigger=True))
    on, off = statistics.median(with_trigger), statistics.median(without_trigger)
    print(f"worker drain, {args.rows} rows, trigger off: {off:,.0f} rows/s ({_fmt(without_trigger)})")
    print(f"worker drain, {args.rows} rows, trigger on:  {on:,.0f} rows/s ({_fmt(with_trigger)})")
    print(f"  ratio trigger on/off: {on / off:.2f}")
    sink = Sink(0.0)
    try:
        log_rates = [relay_rate(args.relay_rows, "log", None) for _ in range(args.rounds)]
        http_rates = [relay_rate(args.relay_rows, "http", sink.url) for _ in range(args.rounds)]
    finally:
        sink.stop()
    lg, ht = statistics.median(log_rates), statistics.median(http_rates)
    print(f"relay, {args.relay_rows} events, log publisher:  {lg:,.0f} events/s")
    print(f"relay, {args.relay_rows} events, http publisher: {ht:,.0f} events/s")
    print(f"  ratio http/log: {ht / lg:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
