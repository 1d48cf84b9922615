"""PARTITIONS: a lane's rows shared by identical workers, one owner per partition, a fair share each."""

from __future__ import annotations

import random
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from notifications_retry.database.locks import AdvisoryLock, PartitionLock, fair_share, lock_names
from notifications_retry.delivery import ChannelClaim, ClaimRequest, Partitions, claim_due, claim_query
from notifications_retry.delivery.claim_statements import PARTITION_OF
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, due_notifications
from tests.integration.test_claim_plan import FAIR_INDEX, PRIMARY_KEY, TABLE, explain, filled  # noqa: F401
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status


def partition_of(count: int) -> dict:
    """Each row's partition among ``count``, as the claim computes it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.id, {PARTITION_OF.format(row='t')} FROM {TABLE} t", {"partition_count": count}
        )
        return dict(cursor.fetchall())


@pytest.fixture
def locks():
    made: list[AdvisoryLock] = []

    def make(partitions: int = 4, first: int = 0, name: str = "tests:partitions") -> PartitionLock:
        made.append(PartitionLock(name, partitions=partitions, first=first))
        return made[-1]

    yield make
    for lock in made:
        lock.close()


def test_one_partition_is_the_lanes_own_lock_and_more_derive_from_it():
    assert lock_names("notifications:retry-worker", 1) == ["notifications:retry-worker"]
    assert lock_names("k:urgent", 3) == [
        "k:urgent:partition:0",
        "k:urgent:partition:1",
        "k:urgent:partition:2",
    ]
    assert [fair_share(4, w) for w in (1, 2, 3, 4, 5)] == [4, 2, 2, 1, 1]


def test_a_single_partition_worker_keeps_the_lanes_one_lock():
    worker = Worker(batch_size=10)
    try:
        assert type(worker.lock) is AdvisoryLock and worker.lock.name == "notifications:retry-worker"
    finally:
        worker.close()


def test_a_worker_takes_its_fair_share_and_gives_back_the_rest_when_another_joins(locks):
    first, second = locks(first=0), locks(first=2)
    assert first.acquire() and first.owned == (0, 1, 2, 3)  # alone: every partition
    assert not second.acquire() and second.short and second.live_workers == 2  # all held; now present
    assert first.still_held() and first.rebalance_due  # four is more than its share of two
    first.release()
    assert first.owned == (0, 1, 2, 3) and first.look()  # between ticks it keeps them, and sees it
    assert first.acquire() and first.owned == (0, 1) and not first.short  # the next tick gives two back
    assert second.acquire() and second.owned == (2, 3)
    assert first.still_held() and not first.rebalance_due
    assert second.still_held() and not second.rebalance_due


def test_a_dead_workers_partitions_are_free_at_once_and_its_share_grows(locks):
    first, second = locks(first=0), locks(first=2)
    first.acquire()
    second.acquire()
    first.release()
    first.acquire()
    second.acquire()
    assert (first.owned, second.owned) == ((0, 1), (2, 3))
    second._conn.close()  # a killed worker: its session ends, and its locks with it
    # The server ends the backend a moment after its client went away.
    wait_until(lambda: first.still_held() and first.rebalance_due, 5, message="the dead worker's locks freed")
    assert first.live_workers == 1
    first.release()
    assert first.acquire() and first.owned == (0, 1, 2, 3)


def test_lanes_and_partitions_compose(locks):
    urgent, bulk = locks(name="tests:lane-urgent"), locks(name="tests:lane-bulk")
    assert urgent.acquire() and bulk.acquire()
    assert urgent.owned == bulk.owned == (0, 1, 2, 3) and urgent.live_workers == bulk.live_workers == 1


def test_each_row_is_claimed_only_by_its_partitions_owner(clock):
    channel = ChannelFactory(key="in_app")
    rows = due_notifications(clock, channel, 200)
    where = partition_of(4)
    claimed: Counter = Counter()
    for owned in [(0,), (1, 2), (3,)]:
        batch = claim_due(
            ClaimRequest(
                clock.now(),
                [ChannelClaim(channel.pk, 500, 60.0)],
                total=500,
                budgets={channel.pk: (5, channel.key)},
                partitions=Partitions(4, owned),
            )
        )
        assert batch.records and all(where[r.id] in owned for r in batch.records)
        claimed.update(r.id for r in batch.records)
    assert set(claimed) == {r.pk for r in rows} and set(claimed.values()) == {1}
    # Spread: no partition holds fewer than half its even part of 200 random ids.
    assert min(Counter(where.values()).values()) >= 25


def test_a_lapsed_lease_is_given_back_and_taken_only_by_its_partitions_owner(clock):
    channel = ChannelFactory(key="email", provider_key="stub", timeout_seconds=5)
    due_notifications(clock, channel, 40)
    where = partition_of(4)
    plan, budgets = [ChannelClaim(channel.pk, 500, 60.0)], {channel.pk: (5, channel.key)}
    assert len(claim_due(ClaimRequest(clock.now(), plan, total=500, budgets=budgets)).records) == 40
    clock.advance(61)  # the worker that held them all died: every lease lapsed
    taken: Counter = Counter()

    def running() -> set:
        return set(
            NotificationEntity.objects.filter(claim_expires_at__isnull=False).values_list("pk", flat=True)
        )

    for owned in [(0,), (1, 2), (3,)]:
        before = running()
        batch = claim_due(
            ClaimRequest(clock.now(), plan, total=500, budgets=budgets, partitions=Partitions(4, owned))
        )
        assert batch.records and all(where[r.id] in owned for r in batch.records)
        # Only its own partitions' lapsed leases were given back (and some taken again: a new lease).
        assert all(where[pk] in owned for pk in before - running())
        taken.update(r.id for r in batch.records)
    assert set(taken.values()) == {1}, "each row taken once"


def test_the_partitioned_claim_still_walks_the_due_index(clock, filled):  # noqa: F811
    plan = [ChannelClaim(c.pk, 100, 60.0) for c in filled]
    sql, params = claim_query(
        clock.now() + timedelta(seconds=1), plan, total=100, partitions=Partitions(4, (1, 3))
    )
    nodes = explain(sql, params)
    on_table = [n for n in nodes if n.get("Relation Name") == TABLE]
    assert on_table and all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_table), nodes
    # The partition is a filter on index entries the claim reads anyway: the same indexes, no table scan.
    assert {n.get("Index Name") for n in on_table} == {FAIR_INDEX, PRIMARY_KEY}


@pytest.mark.django_db(transaction=True)
def test_two_workers_each_send_their_partitions_rows_with_their_part_of_the_limits(clock, settings):
    settings.NOTIFICATIONS_RETRY = {"PARTITIONS": 4}
    channel = ChannelFactory(key="in_app", max_concurrency=64, rate_limit_per_second=200)
    rows = due_notifications(clock, channel, 120)
    where = partition_of(4)
    a = Worker(clock=clock, rng=random.Random(0), batch_size=1000)
    b = Worker(clock=clock, rng=random.Random(3), batch_size=1000)
    try:
        assert b.lock.acquire() and len(b.lock.owned) == 4  # alone so far: every partition
        assert a.tick().skipped  # present now, but nothing is free
        first = b.tick()  # b's share is two: it gives two back
        assert len(first.partitions) == 2 and first.sent > 0
        runtime = b.channels.runtimes[channel.pk]
        assert (runtime.max_concurrency, runtime.rate_limit) == (32, 100.0)
        sent_by_b = set(NotificationEntity.objects.filter(status=Status.SENT).values_list("pk", flat=True))
        assert {where[pk] for pk in sent_by_b} == set(first.partitions)
        second = a.tick()
        assert set(second.partitions) == {0, 1, 2, 3} - set(first.partitions)
        assert first.sent + second.sent == len(rows)
        assert NotificationEntity.objects.filter(status=Status.SENT).count() == len(rows)
    finally:
        a.close()
        b.close()


_ONE_ROW_TENANTS = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), %(channel)s, 'u' || g, '{{}}'::jsonb, '', 5, 'failed', 1,
       %(now)s::timestamptz - interval '1 minute', NULL, '', '', '[]'::jsonb, '', '', 0, '',
       %(now)s::timestamptz, %(now)s::timestamptz
FROM generate_series(1, 3000) AS g
"""


def test_a_partitioned_claim_fills_up_among_more_tenants_than_one_claim_visits(clock):
    # 3,000 tenants of one row each: a claim visits at most TENANTS_PER_CLAIM (1,000) of them, so the
    # walk must count only tenants with a row in the worker's partitions, or it would come back short.
    channel = ChannelFactory(key="in_app")
    with connection.cursor() as cursor:
        cursor.execute(_ONE_ROW_TENANTS, {"channel": channel.pk, "now": clock.now()})
    mine = sum(1 for p in partition_of(8).values() if p == 0)
    batch = claim_due(
        ClaimRequest(
            clock.now(),
            [ChannelClaim(channel.pk, 200, 60.0)],
            total=200,
            budgets={channel.pk: (5, channel.key)},
            partitions=Partitions(8, (0,)),
        )
    )
    assert len(batch.records) == min(200, mine) and mine > 200
