"""``python -m bench.crash`` (``make crash-bench``): what SIGKILLs during a drain cost.

For each ``max_concurrency`` (10 and 32 by default), on a webhook channel whose receiver answers in
20 ms and counts the POSTs per ``Idempotency-Key``:

1. the normal rate: a looping ``retry_worker`` drains the rows undisturbed;
2. the kill run: a looping worker is started, SIGKILLed at a random moment after its first send,
   and started again, 20 times (rows are added whenever less than half a backlog is left, so every
   kill, the last one too, lands on a worker with rows to send);
3. recovery: once the leases the last worker left have run out, a worker drains what is left; the
   rate at which it sends the rows whose lease expired is the recovery rate.

Printed: rows lost (every row must end Sent), outbox rows against Sent rows, duplicate sends (total and
per kill), the recovery rate against the normal rate, and the wall time. The worker is driven only
through its management command and the rows it leaves, so this runs against whatever the engine is.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from collections.abc import Callable

from bench.cluster import run_on_server
from bench.crash_worker import LoopingWorker
from bench.db import (
    TABLE,
    add_rows,
    bench_dbname,
    connect,
    count_outbox,
    count_sent,
    recreate_database,
    reset_rows,
    setup_django,
)
from bench.receiver import Sink, webhook_channel
from bench.report import table

RECEIVER_DELAY = 0.02
# The engine issue bounds duplicates per kill by max_concurrency plus the outcomes one completer delay
# holds; the delay is at most 50 ms, so that many seconds of sends at the normal rate.
COMPLETER_DELAY = 0.05
RECOVERY_SHARE_TARGET = 0.10


@dataclasses.dataclass
class CrashResult:
    concurrency: int
    rows: int
    kills: int
    lost: int
    sent: int
    outbox: int
    duplicates: int
    stranded: int
    recovery_rate: float
    normal_rate: float
    wall: float
    #: Each kill's duplicate sends (see :func:`_owed_by_kill`); their sum is checked against ``duplicates``.
    by_kill: list[int] = dataclasses.field(default_factory=list)

    @property
    def per_kill(self) -> float:
        return self.duplicates / self.kills if self.kills else 0.0


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def _leased_ids() -> list[object]:
    with connect() as conn:
        rows = conn.execute(f"SELECT id FROM {TABLE} WHERE claim_token IS NOT NULL").fetchall()
        return [r[0] for r in rows]


def _leases_expired() -> bool:
    with connect() as conn:
        row = conn.execute(
            f"SELECT coalesce(max(claim_expires_at) < clock_timestamp(), true) FROM {TABLE} "
            "WHERE claim_token IS NOT NULL"
        ).fetchone()
        return bool(row and row[0])


#: After a SIGKILL, how long requests already on the wire take to reach the receiver, and a COMMIT the
#: server had already read takes to finish, before a kill's damage is read.
SETTLE_SECONDS = 0.2


def _owed_by_kill(keys: dict[str, int], accounted: dict[str, int]) -> int:
    """The duplicate sends a kill just caused: POSTs the receiver has seen for rows the database still
    does not hold as Sent (each will be sent again), not yet charged to an earlier kill."""
    with connect() as conn:
        rows = conn.execute(f"SELECT id::text FROM {TABLE} WHERE status <> 'sent'").fetchall()
    unsent = {r[0] for r in rows}
    owed = 0
    for key, count in keys.items():
        if key in unsent and count > accounted.get(key, 0):
            owed += count - accounted.get(key, 0)
            accounted[key] = count
    return owed


def _sent_among(ids: list[object]) -> int:
    with connect() as conn:
        sql = f"SELECT count(*) FROM {TABLE} WHERE status = 'sent' AND id = ANY(%s)"
        row = conn.execute(sql, (ids,)).fetchone()
        return int(row[0]) if row else 0


def normal_rate(sink: Sink, cid: int, rows: int, timeout: float) -> float:
    """Rows/s of an undisturbed looping worker, from its first send to its last."""
    reset_rows()
    add_rows([cid], rows)
    sink.reset()
    worker = LoopingWorker()
    try:
        if not wait_for(lambda: count_sent() >= rows, timeout):
            raise RuntimeError(f"the undisturbed drain did not finish:\n{worker.output_tail()}")
    finally:
        worker.stop()
    arrivals = sink.stats()["arrivals"]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    return (len(arrivals) - 1) / span if span else 0.0


def kill_run(sink: Sink, cid: int, rows: int, kills: int, rng: random.Random, timeout: float) -> CrashResult:
    """SIGKILL a looping worker ``kills`` times at random moments, then let one finish the drain."""
    reset_rows()
    add_rows([cid], rows)
    total = rows
    sink.reset()
    started = time.monotonic()
    accounted: dict[str, int] = {}
    by_kill: list[int] = []
    for _ in range(kills):
        # Refill before the backlog runs low: a worker that drained everything before its kill would
        # strand nothing, and the last kill must leave leased rows for the recovery to be measured.
        if total - count_sent() < rows // 2:
            add_rows([cid], rows, start=total + 1)
            total += rows
        before = sink.count()
        worker = LoopingWorker()

        def sent_more(before: int = before) -> bool:
            return sink.count() > before

        if not wait_for(sent_more, timeout):
            worker.kill()
            tail = worker.output_tail()
            raise RuntimeError(f"a restarted worker sent nothing within {timeout:g} s:\n{tail}")
        time.sleep(rng.uniform(0.05, 0.6))
        worker.kill()
        time.sleep(SETTLE_SECONDS)
        by_kill.append(_owed_by_kill(sink.keys(), accounted))
    stranded = _leased_ids()
    wait_for(_leases_expired, timeout)
    before = sink.count()
    worker = LoopingWorker()
    try:
        wait_for(lambda: sink.count() > before, timeout)
        recovery_started = time.monotonic()
        wait_for(lambda: _sent_among(stranded) >= len(stranded), timeout)
        recovery_seconds = time.monotonic() - recovery_started
        wait_for(lambda: count_sent() >= total, timeout)
    finally:
        worker.stop()
    wall = time.monotonic() - started
    sent = count_sent()
    keys = sink.keys()
    return CrashResult(
        concurrency=0,
        rows=total,
        kills=kills,
        lost=total - sent,
        sent=sent,
        outbox=count_outbox(),
        duplicates=sum(n - 1 for n in keys.values()),
        stranded=len(stranded),
        recovery_rate=len(stranded) / recovery_seconds if stranded and recovery_seconds else 0.0,
        normal_rate=0.0,
        wall=wall,
        by_kill=by_kill,
    )


def _report(results: list[CrashResult]) -> tuple[str, list[str]]:
    missed: list[str] = []
    rows = []
    for r in results:
        bound = r.concurrency + r.normal_rate * COMPLETER_DELAY
        share = r.recovery_rate / r.normal_rate if r.normal_rate else 0.0
        checks = {
            "lost": r.lost == 0,
            "outbox = Sent": r.outbox == r.sent,
            "duplicates/kill": r.per_kill <= bound,
            # The bound holds "at every kill", not only on average.
            "worst kill": max(r.by_kill, default=0) <= bound,
            "recovery/normal": share >= RECOVERY_SHARE_TARGET,
        }
        missed += [f"{name} (c={r.concurrency})" for name, ok in checks.items() if not ok]
        rows.append(
            [
                f"{r.concurrency}",
                f"{r.rows:,}",
                f"{r.lost}",
                f"{r.outbox:,} / {r.sent:,}",
                f"{r.duplicates:,}",
                f"{r.per_kill:.1f} (<= {bound:.0f})",
                f"{max(r.by_kill, default=0)} ({sum(r.by_kill):,} of {r.duplicates:,} charged)",
                f"{r.stranded:,}",
                f"{r.recovery_rate:,.0f} / {r.normal_rate:,.0f} = {share:.2f}",
                f"{r.wall:.0f}",
            ]
        )
    header = [
        "max_concurrency",
        "rows",
        "lost",
        "outbox / Sent",
        "duplicate sends",
        "per kill",
        "worst kill",
        "leased at last kill",
        "recovery / normal rows/s",
        "wall s",
    ]
    notes = (
        f"Targets: 0 lost; outbox rows = Sent rows; duplicates per kill, on average and at the worst kill, "
        f"<= max_concurrency + "
        f"{COMPLETER_DELAY * 1000:.0f} ms of sends at the normal rate; recovery >= "
        f"{RECOVERY_SHARE_TARGET:.2f} of the normal rate.\n"
        "Worst kill: the most duplicate sends one kill caused, read "
        f"{SETTLE_SECONDS * 1000:.0f} ms after it: POSTs the receiver saw for rows the database does not "
        "hold as Sent (each is sent again); the kills' sum is set against all duplicates."
    )
    return table(header, rows) + "\n" + notes, missed


def _measure(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    print(
        f"notifications_retry crash benchmark — database {bench_dbname()!r}; SIGKILL x{args.kills} at random "
        f"moments, receiver answering in {RECEIVER_DELAY * 1000:.0f} ms; seed {args.seed}"
    )
    recreate_database()
    setup_django()
    results = []
    sink = Sink(RECEIVER_DELAY)
    try:
        for conc in args.concurrency:
            # A short timeout makes the leases short (the lease is a few timeouts plus a grace).
            cid = webhook_channel(sink, max_concurrency=conc)
            from notifications_retry.models import ChannelConfig

            ChannelConfig.objects.filter(pk=cid).update(timeout_seconds=args.timeout, max_attempts=100)
            normal = normal_rate(sink, cid, args.rows, args.step_timeout)
            result = kill_run(sink, cid, args.rows, args.kills, rng, args.step_timeout)
            result.concurrency, result.normal_rate = conc, normal
            results.append(result)
            print(f"max_concurrency {conc}: done ({result.wall:.0f} s)", flush=True)
    finally:
        sink.stop()
    text, missed = _report(results)
    print("\n" + text)
    print("\nTargets missed: " + (", ".join(missed) if missed else "none"))
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m bench.crash", description=description)
    parser.add_argument("--rows", type=int, default=3000, help="Due rows per drain (added to if needed).")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 32])
    parser.add_argument("--timeout", type=float, default=1.0, help="The channel's timeout (sets leases).")
    parser.add_argument("--step-timeout", type=float, default=120.0, help="Longest wait for any one step.")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--server", choices=["private", "url"], default="url")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_crash_bench")
    return run_on_server(args.server, lambda: _measure(args))


if __name__ == "__main__":
    sys.exit(main())
