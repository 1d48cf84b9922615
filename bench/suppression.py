"""``python -m bench.suppression`` (``make bench-suppression``): what the suppression check costs a claim.

The worker's claim (:func:`notifications_retry.delivery.claim_due`, 500 rows, rolled back after each
run) on a table of due rows, with the suppression list empty and holding ``--suppressed`` addresses
(``--hits`` of them among each batch's recipients). For each, interleaved over ``--rounds``:

* the claim as it runs (one lookup per batch);
* the same claim with the lookup replaced by one that finds nothing and asks nothing (no check);
* the lookup's own time inside the claim (normalizing the batch's recipients, the statement, the
  match), measured by wrapping it.

Uses its own database (``nr_bench_suppression`` unless NR_BENCH_DATABASE_NAME is set). Figures move
between runs and machines: compare only the ratios printed by one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Generator
from datetime import UTC, datetime
from typing import Any

os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_bench_suppression")

# The database name is chosen above, before bench.db reads it.
from bench.db import add_rows, channel, connect, recreate_database

CLAIM_ROWS = 500


def _fill_suppressions(count: int, hits: int) -> None:
    """``count`` suppressed addresses, ``hits`` of them recipients of the first due rows."""
    with connect(autocommit=True) as conn:
        conn.execute("TRUNCATE notifications_retry_suppression")
        if not count:
            return
        conn.execute(
            """
            INSERT INTO notifications_retry_suppression
                (address, channel, reason, source, detail, first_event_at, last_event_at, events)
            SELECT CASE WHEN g <= %(hits)s THEN 'user' || (g * 20) || '@example.com'
                        ELSE 'gone' || g || '@example.org' END,
                   '*', 'hard_bounce', 'bench', '', now(), now(), 1
            FROM generate_series(1, %(count)s) AS g
            """,
            {"count": count, "hits": hits},
        )
        conn.execute("VACUUM ANALYZE notifications_retry_suppression")


def _claim_ms(cid: int, repeat: int, lookup: Callable[..., Any], spent: list[float]) -> tuple[float, int]:
    """Median ms of one 500-row claim with ``lookup`` as the claim's suppression check; rows settled."""
    from django.db import transaction

    from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim, claim_due

    original = claim.suppressed_steps
    claim.suppressed_steps = lookup  # type: ignore[attr-defined]
    times: list[float] = []
    settled = 0
    try:
        for _ in range(repeat):
            started = time.perf_counter()
            with transaction.atomic():
                batch = claim_due(
                    ClaimRequest(
                        datetime.now(UTC),
                        [ChannelClaim(cid, CLAIM_ROWS, 60.0)],
                        total=CLAIM_ROWS,
                        budgets={cid: (5, "email")},
                    )
                )
                transaction.set_rollback(True)
            times.append((time.perf_counter() - started) * 1000)
            settled = len(batch.settled)
            assert len(batch.records) + settled == CLAIM_ROWS, len(batch.records)
    finally:
        claim.suppressed_steps = original  # type: ignore[attr-defined]
    return statistics.median(times), settled


def _timed(spent: list[float]) -> Callable[..., Any]:
    from notifications_retry.delivery.suppression import suppressed_steps

    def lookup(*args: Any, **kwargs: Any) -> Generator[Any, Any, dict[Any, str]]:
        # The lookup's statements run while it is suspended at its yield: timed from its first step
        # to its result, that includes the statement.
        started = time.perf_counter()
        try:
            return (yield from suppressed_steps(*args, **kwargs))
        finally:
            spent.append((time.perf_counter() - started) * 1000)

    return lookup


def _none(*args: Any, **kwargs: Any) -> Generator[Any, Any, dict[Any, str]]:
    yield from ()
    return {}


def _explain() -> str:
    from django.db import connection

    from notifications_retry.delivery import suppression

    addresses = [f"user{i}@example.com" for i in range(20, 20 * (CLAIM_ROWS + 1), 20)]
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY OFF) " + suppression._LOOKUP,
            {"addresses": json.dumps(addresses), "now": datetime.now(UTC)},
        )
        return "\n".join(r[0] for r in cursor.fetchall())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="rows in the table (1 in 20 due)")
    parser.add_argument("--suppressed", type=int, default=100_000, help="addresses on the list")
    parser.add_argument("--hits", type=int, default=5, help="suppressed recipients among a batch's rows")
    parser.add_argument("--repeat", type=int, default=30, help="claims per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", choices=["url"], default="url", help="the server of DATABASE_URL")
    args = parser.parse_args(argv)
    if args.rows < CLAIM_ROWS * 20:
        parser.error(
            f"--rows must be at least {CLAIM_ROWS * 20}: 1 in 20 is due and a claim takes {CLAIM_ROWS}"
        )
    recreate_database()
    cid = channel("email", "stub")
    add_rows([cid], args.rows, due_every=20)
    print(f"claims of {CLAIM_ROWS} rows, {args.rows:,} rows in the table, median of {args.repeat} per round")
    for count, hits in ((0, 0), (args.suppressed, args.hits)):
        _fill_suppressions(count, hits)
        _claim_ms(cid, 5, _none, [])  # warm-up: caches, plans, the connection
        checked, unchecked, own = [], [], []
        settled = 0
        for _ in range(args.rounds):
            spent: list[float] = []
            ms, settled = _claim_ms(cid, args.repeat, _timed(spent), spent)
            checked.append(ms)
            own.append(statistics.median(spent))
            unchecked.append(_claim_ms(cid, args.repeat, _none, [])[0])
        with_check, without = statistics.median(checked), statistics.median(unchecked)
        lookup = statistics.median(own)
        print(
            f"list of {count:,} ({settled} of the batch suppressed): claim {with_check:.2f} ms with "
            f"the check, {without:.2f} ms without; the lookup {lookup:.3f} ms per claim "
            f"({lookup / with_check:.1%} of the claim, {lookup * 1000 / CLAIM_ROWS:.2f} us per row); "
            f"ratio with/without {with_check / without:.3f}"
        )
    print("the lookup's plan on the full list (a batch of 500 addresses):")
    print(_explain())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
