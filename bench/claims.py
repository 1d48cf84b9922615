"""The claim's time and plan at 100 k (and 5 M) rows with 1 % due, through the delivery module."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from datetime import UTC, datetime


def claim_time(channels: Sequence[int], repeat: int = 30) -> float:
    """Median milliseconds of one tick's claim (100 rows over ``channels``), rolled back each time."""
    from django.db import connection, transaction

    from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due

    budgets = {cid: (5, f"c{cid}") for cid in channels}
    plan = [ChannelClaim(cid, 100, 60.0) for cid in channels]
    times = []
    connection.close()
    for _ in range(repeat + 3):
        started = time.perf_counter()
        with transaction.atomic():
            batch = claim_due(ClaimRequest(datetime.now(UTC), plan, total=100, budgets=budgets))
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
