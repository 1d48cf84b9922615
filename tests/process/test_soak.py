"""Scenario 11 (soak, run with --soak or NR_SOAK=1 / ``make soak``): a 1-million-row backlog, and a
long-running transaction elsewhere holding back vacuum. Prints the figures docs/ cite."""

from __future__ import annotations

import os
import re
import time

import psycopg
import pytest
from django.db import connection

from notifications_retry.models import ChannelConfig
from tests.process.conftest import seed_due

pytestmark = [
    pytest.mark.process,
    pytest.mark.soak,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(3600),
]

BACKLOG = int(os.environ.get("NR_SOAK_BACKLOG", "1000000"))
TICK_ROWS = int(os.environ.get("NR_SOAK_TICK_ROWS", "100000"))
TABLE = "notifications_retry_notificationentity"


def dead_tuples() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = %s", [TABLE])
        return int(cursor.fetchone()[0])


def vacuum() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM {TABLE}")


def tick_rate(start_worker) -> float:
    """Rows per second of one ``--once`` tick over ``TICK_ROWS`` due rows (the worker's own figure)."""
    worker = start_worker(["--once", "--batch-size", str(TICK_ROWS), "--max-duration", "3000"], name="soak")
    assert worker.wait(3000) == 0, worker.output()[-3000:]
    line = next(line for line in worker.output().splitlines() if "cycle-completed" in line)
    processed = int(re.search(r"processed=(\d+)", line).group(1))
    duration_ms = float(re.search(r"duration_ms=([\d.]+)", line).group(1))
    assert processed == TICK_ROWS
    return processed / (duration_ms / 1000)


def test_backlog_of_a_million_with_vacuum_held_back_keeps_half_the_throughput(start_worker):
    channel = ChannelConfig.objects.create(key="in_app", provider_key="in_app", timeout_seconds=5.0)
    started = time.monotonic()
    for _ in range(BACKLOG // 100_000):
        seed_due(channel, 100_000)
    seed_due(channel, BACKLOG % 100_000)
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM ANALYZE {TABLE}")
    print(f"\nseeded {BACKLOG} due rows in {time.monotonic() - started:.0f}s")

    normal = tick_rate(start_worker)
    vacuum()
    dead_before_blocker = dead_tuples()
    # Another session holds a snapshot open (a report, a stuck transaction): vacuum cannot reclaim.
    blocker = psycopg.connect(
        host=connection.settings_dict["HOST"] or "127.0.0.1",
        port=connection.settings_dict["PORT"] or 5432,
        user=connection.settings_dict["USER"],
        dbname=connection.settings_dict["NAME"],
    )
    try:
        blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        blocker.execute(f"SELECT count(*) FROM {TABLE}").fetchone()
        held = [tick_rate(start_worker) for _ in range(2)]
        vacuum()
        dead_while_held = dead_tuples()
    finally:
        blocker.rollback()
        blocker.close()
    vacuum()
    dead_after = dead_tuples()
    print(
        f"rows/s normal {normal:.0f}; with vacuum held back {held[0]:.0f}, {held[1]:.0f} "
        f"(ratio {min(held) / normal:.2f}); dead tuples after VACUUM: before the blocker "
        f"{dead_before_blocker}, "
        f"while held {dead_while_held}, after it ended {dead_after}"
    )
    assert min(held) >= normal / 2
    assert dead_while_held >= TICK_ROWS, "the held snapshot keeps the dead row versions"
    assert dead_after < dead_while_held / 100, "once the snapshot is gone, vacuum reclaims them"
