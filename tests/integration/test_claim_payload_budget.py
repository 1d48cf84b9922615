"""A claim reads at most about ``CLAIM_PAYLOAD_BYTES`` of payloads, whatever its row limit: rows past
the budget stay due and unleased (their payloads are not even read), and the next claim takes them."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable

import pytest
from django.db import connection, connections

from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due
from notifications_retry.delivery import claim_statements as claim_module
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, due_notifications

pytestmark = pytest.mark.django_db(transaction=True)

Status = NotificationEntity.Status
TABLE = NotificationEntity._meta.db_table


def with_payloads(rows: list[NotificationEntity], make: Callable[[], str]) -> None:
    """Give each row a payload of its own (``make()``), written as other code would."""
    with connection.cursor() as cursor:
        for row in rows:
            cursor.execute(f"UPDATE {TABLE} SET payload = %s::jsonb WHERE id = %s", [make(), row.pk])


def incompressible(size: int) -> str:
    return json.dumps({"body": base64.b64encode(os.urandom(size * 3 // 4)).decode()})


def claim(clock, channel, limit: int = 100):
    return claim_due(
        ClaimRequest(
            clock.now(),
            [ChannelClaim(channel.pk, limit, 60.0)],
            total=limit,
            budgets={channel.pk: (channel.max_attempts, channel.key)},
        )
    )


@pytest.fixture
def budget(monkeypatch):
    def set_budget(size: int) -> None:
        monkeypatch.setattr(claim_module, "CLAIM_PAYLOAD_BYTES", size)

    return set_budget


def test_rows_past_the_budget_stay_due_and_unleased_and_the_next_claim_takes_them(clock, budget):
    channel = ChannelFactory(key="webhook-ish", provider_key="stub")
    rows = due_notifications(clock, channel, 5)
    with_payloads(rows, lambda: incompressible(40_000))
    budget(100_000)  # 0, 40 k and 80 k read before: three rows; the fourth would start past it
    first = claim(clock, channel)
    assert len(first.records) == 3 and first.more, "cut by the budget, and more is due"
    assert all(len(r.payload["body"]) == 40_000 for r in first.records), "their payloads read whole"
    in_line = sorted(rows, key=lambda r: r.next_attempt_at)
    assert [r.id for r in first.records] == [r.pk for r in in_line[:3]], "oldest due first"
    left = NotificationEntity.objects.filter(pk__in=[r.pk for r in in_line[3:]])
    assert [(r.attempts, r.claim_token) for r in left] == [(1, None), (1, None)], "not leased, not counted"
    second = claim(clock, channel)
    assert [r.id for r in second.records] == [r.pk for r in in_line[3:]]
    assert not second.more


@pytest.mark.parametrize(("server", "within"), [("14+", 1), ("13", 2)])
def test_a_compressed_payload_never_counts_as_less_than_it_is(
    clock, budget, settings, server, within, monkeypatch
):
    # 30 KB of text stored in about 370 bytes. On 14+ it counts as MAX_PAYLOAD_BYTES; on 13, without
    # pg_column_compression(), as 90 times what it stores (pglz cannot shrink more than about 88 to 1).
    if server == "13":
        monkeypatch.setattr(connections["default"], "pg_version", 130000)
    settings.NOTIFICATIONS_RETRY = {**settings.NOTIFICATIONS_RETRY, "MAX_PAYLOAD_BYTES": 64 * 1024}
    channel = ChannelFactory(key="bulky", provider_key="stub")
    rows = due_notifications(clock, channel, 3)
    with_payloads(rows, lambda: json.dumps({"body": "x" * 30_000}))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT pg_column_compression(payload), pg_column_size(payload) FROM {TABLE}")
        stored = cursor.fetchall()
    assert all(method is not None and size < 1_000 for method, size in stored), stored
    budget(60_000)  # at their stored size all three would fit; at their real size (30 KB) two would
    batch = claim(clock, channel)
    assert len(batch.records) == within and batch.more
    # Small payloads count at their stored size (all fit) or, on 13, at 90 times it.
    small = due_notifications(clock, ChannelFactory(key="small", provider_key="stub"), 50)
    claimed = len(claim(clock, small[0].channel).records)
    assert claimed == 50 if server == "14+" else 2 < claimed < 50


def test_a_tick_cut_short_by_the_budget_still_drains_every_due_row(clock, budget):
    channel = ChannelFactory(key="in_app")
    rows = due_notifications(clock, channel, 12)
    with_payloads(rows, lambda: incompressible(40_000))
    budget(100_000)
    worker = Worker(batch_size=500, max_duration=60, clock=clock)
    try:
        [stats] = worker.run(once=True)
    finally:
        worker.close()
    assert stats.sent == stats.processed == 12 and not stats.error
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}
