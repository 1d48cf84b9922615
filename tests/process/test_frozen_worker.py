"""A frozen worker (SIGSTOP inside an open finalize transaction) cannot hold rows: the server ends its
transaction within TRANSACTION_TIMEOUT_SECONDS (the shipped 30 s), and once continued its late commit
changes nothing it should not, its outcomes are kept and committed, and nothing is sent twice."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from notifications_retry.delivery.session import TRANSACTION_TIMEOUT_SECONDS
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory
from tests.process.conftest import seed_due
from tests.process.helpers import assert_one_event_per_final_outcome
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

TIMEOUT = TRANSACTION_TIMEOUT_SECONDS
#: The server checks the idle-in-transaction timeout once it expires; allow for a loaded machine.
SLACK = 3.0


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def _idle_in_transaction(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
        "AND datname = current_database()"
    ).fetchone()
    return int(row[0])


def test_a_frozen_worker_frees_its_rows_within_the_bound_and_loses_nothing(start_worker):
    channel = ChannelFactory(
        key="slow", provider_key="stub", options={"delay_seconds": 0.001}, timeout_seconds=5
    )
    seed_due(channel, 30)
    worker = start_worker(
        ["--once", "--batch-size", "30"],
        # Leases outlive the bound: the rows are the frozen worker's until the server frees them.
        {"LEASE_GRACE_SECONDS": TIMEOUT + 30},
        env={"NR_TEST_FREEZE_IN_FINALIZE": "1"},
    )
    wait_until(lambda: stopped(worker.pid), 30, 0.02, "the worker froze inside its finalize")
    frozen_at = time.monotonic()
    held = [
        str(pk)
        for pk in NotificationEntity.objects.filter(claim_token__isnull=False).values_list("pk", flat=True)
    ]
    assert held, "the frozen transaction's rows are leased"
    # The monolith updates those rows: it waits at most the bound, then gets them.
    dsn = connection.get_connection_params()
    with psycopg.connect(
        **{k: v for k, v in dsn.items() if k != "cursor_factory"}, autocommit=True
    ) as monolith:
        monolith.execute("SET lock_timeout = '200ms'")
        while True:
            try:
                monolith.execute(
                    "UPDATE notifications_retry_notificationentity SET payload = payload "
                    "WHERE id = ANY(%s::uuid[])",
                    [held],
                )
                break
            except psycopg.errors.LockNotAvailable:
                assert time.monotonic() - frozen_at < TIMEOUT + SLACK, "rows still locked past the bound"
        freed_after = time.monotonic() - frozen_at
        # Every transaction the frozen process had open ends within the bound, not only the finalize
        # whose rows were just freed: the worker's own thread may have been in a claim that began after
        # the finalize's last statement, so it is waited for, not sampled once.
        while (idle := _idle_in_transaction(monolith)) and time.monotonic() - frozen_at < TIMEOUT + SLACK:
            time.sleep(0.05)
    assert freed_after < TIMEOUT + SLACK
    assert idle == 0
    worker.send(18)  # SIGCONT: its commit fails (the server closed the session), its outcomes are kept
    assert worker.wait(60) == 0, worker.output()[-3000:]
    rows = NotificationEntity.objects.filter(channel=channel)
    assert rows.filter(status="sent").count() == 30, worker.output()[-3000:]
    assert set(rows.values_list("attempts", flat=True)) == {2}, "each row was sent once"
    assert not rows.filter(claim_token__isnull=False).exists()
    assert_one_event_per_final_outcome()
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
