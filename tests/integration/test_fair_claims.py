"""The claim's order within a channel: round-robin across tenants (null is a tenant of its own), oldest
due first within each, priority breaking ties; lanes' priorities, locked rows and the tenant ring."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_due, claim_query
from notifications_retry.delivery.claim_statements import ring_start
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory
from tests.support.due_rows import due_rows as due

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
Priority = NotificationEntity.Priority
A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)


def claim(clock, channels, limit, *, total=None, **kwargs):
    plan = [ChannelClaim(c.pk, limit, 60.0) for c in channels]
    budgets = {c.pk: (c.max_attempts, c.key) for c in channels}
    total = total if total is not None else limit * len(channels)
    return claim_due(ClaimRequest(clock.now(), plan, total=total, budgets=budgets, **kwargs)).records


def test_a_claim_takes_rows_round_robin_across_tenants_null_included_oldest_first_in_each(clock):
    channel = ChannelFactory(key="in_app")
    # A's rows are the oldest by far; the null tenant's next; B's the newest.
    rows_a = due(clock, channel, A, 50, ago=3600)
    rows_null = due(clock, channel, None, 3, ago=600)
    rows_b = due(clock, channel, B, 5, ago=60)
    records = claim(clock, [channel], 9)
    # Round one: each tenant's oldest row, in the order those rows fell due; then round two, three.
    assert [r.id for r in records] == [
        rows_a[0].pk, rows_null[0].pk, rows_b[0].pk,
        rows_a[1].pk, rows_null[1].pk, rows_b[1].pk,
        rows_a[2].pk, rows_null[2].pk, rows_b[2].pk,
    ]  # fmt: skip
    # The null tenant ran out: the next claim goes on with A and B only, each where it left off.
    records = claim(clock, [channel], 4)
    assert [r.id for r in records] == [rows_a[3].pk, rows_b[3].pk, rows_a[4].pk, rows_b[4].pk]


def test_a_tenant_with_a_huge_backlog_delays_another_tenants_rows_by_one_claim_at_most(clock):
    channel = ChannelFactory(key="in_app")
    due(clock, channel, A, 2000, ago=7200, spread=0.5)
    rows_b = due(clock, channel, B, 20, ago=30, spread=0.1)
    records = claim(clock, [channel], 40)
    # Every one of B's 20 due rows is in the very first claim, beside 20 of A's.
    assert {r.id for r in records} >= {r.pk for r in rows_b}
    assert sum(r.tenant_id == A for r in records) == 20


def test_priority_breaks_ties_within_a_tenant_and_a_lane_claims_only_its_priorities(clock):
    channel = ChannelFactory(key="in_app")
    low = due(clock, channel, A, 2, ago=100, spread=0, priority=Priority.LOW)
    high = due(clock, channel, A, 2, ago=100, spread=0, priority=Priority.HIGH)
    older = due(clock, channel, A, 1, ago=200, priority=Priority.LOW)
    b_high = due(clock, channel, B, 3, ago=50, priority=Priority.HIGH)
    # Within A: oldest due first, then high before low at an equal due time.
    records = claim(clock, [channel], 10)
    in_a = [r.id for r in records if r.tenant_id == A]
    assert in_a[0] == older[0].pk
    assert set(in_a[1:3]) == {r.pk for r in high} and set(in_a[3:]) == {r.pk for r in low}
    # Between tenants: round-robin, B's rows alternating with A's while both have some.
    assert [r.id for r in records[1:6:2]] == [r.pk for r in b_high]


def test_a_lane_of_one_priority_takes_its_rows_round_robin_too(clock):
    channel = ChannelFactory(key="in_app")
    due(clock, channel, A, 30, ago=3600, priority=Priority.LOW)
    a_high = due(clock, channel, A, 30, ago=3000, priority=Priority.HIGH)
    b_high = due(clock, channel, B, 2, ago=10, priority=Priority.HIGH)
    records = claim(clock, [channel], 6, priorities=[Priority.HIGH])
    assert {r.priority for r in records} == {Priority.HIGH}
    assert [r.id for r in records] == [a_high[0].pk, b_high[0].pk, a_high[1].pk, b_high[1].pk,
                                       a_high[2].pk, a_high[3].pk]  # fmt: skip


def test_the_total_across_channels_cuts_rounds_not_tenants(clock):
    mail, app = ChannelFactory(key="email", provider_key="stub"), ChannelFactory(key="in_app")
    due(clock, mail, A, 100, ago=3600)
    rows_b = due(clock, mail, B, 3, ago=10)
    due(clock, app, A, 100, ago=3600)
    # 20 rows may come from each channel, 9 in all: the first three rounds of both channels' tenants
    # (ordered by due time alone, the 9 would all be A's).
    records = claim(clock, [mail, app], 20, total=9)
    assert len(records) == 9
    assert {r.id for r in records if r.channel_id == mail.pk and r.tenant_id == B} == {r.pk for r in rows_b}


@pytest.mark.django_db(transaction=True)
def test_rows_another_claim_holds_are_skipped_and_later_picks_fill_the_batch(clock):
    channel = ChannelFactory(key="in_app")
    rows_a = due(clock, channel, A, 10, ago=3600)
    rows_b = due(clock, channel, B, 10, ago=60)
    held = {rows_a[0].pk, rows_b[0].pk, rows_b[1].pk}
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=False) as other:
        other.execute(
            f"SELECT 1 FROM {NotificationEntity._meta.db_table} WHERE id = ANY(%s) FOR UPDATE", (list(held),)
        )
        records = claim(clock, [channel], 8)
        other.rollback()
    assert len(records) == 8
    assert not held & {r.id for r in records}
    # The picks are locked in their round-robin order, skipping the held ones: A's next five, B's next three.
    assert {r.id for r in records} == {r.pk for r in rows_a[1:6] + rows_b[2:5]}


def test_past_the_tenants_a_claim_visits_each_claim_walks_on_round_the_ring(clock):
    """With more tenants than a claim visits, a claim takes a run of them in id order from a start
    drawn from its time, wrapping round; claims at other times start elsewhere, so every tenant's
    turn comes."""
    channel = ChannelFactory(key="in_app")
    tenants = sorted(uuid.UUID(int=(i * 0x1F) << 120) for i in range(1, 7))
    for tenant in tenants:
        due(clock, channel, tenant, 3, ago=600)
    seen: set[uuid.UUID] = set()
    for step in range(40):
        now = clock.now() + timedelta(microseconds=step)
        sql, params = claim_query(now, [ChannelClaim(channel.pk, 10, 60.0)], total=10)
        params["tenants"] = 2
        unlocked = sql.replace("FOR UPDATE OF t SKIP LOCKED", "")
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT tenant_id FROM ({unlocked}) AS due", params)
            visited = {row[0] for row in cursor.fetchall()}
        start = ring_start(now)
        after = [t for t in tenants if t > start] + [t for t in tenants if t <= start]
        assert visited == set(after[:2]), (start, visited)
        seen |= visited
    assert seen == set(tenants)


def test_many_small_tenants_beside_a_large_one_each_get_their_first_row_in_round_one(clock):
    """The walk over tenants reads several index entries a step: tenants of a row or two are found
    many to a step, past a large tenant's run of entries."""
    channel = ChannelFactory(key="in_app")
    small = [uuid.UUID(int=(i + 1) << 100) for i in range(40)]
    big = uuid.UUID(int=(20 << 100) + 1)  # in the middle of the small ones' ids
    due(clock, channel, big, 300, ago=7200)
    firsts = {tenant: due(clock, channel, tenant, 2, ago=60)[0].pk for tenant in small}
    records = claim(clock, [channel], 60)
    assert {r.id for r in records[:41]} == {*firsts.values(), records[0].id}
    assert records[0].tenant_id == big
    assert sum(r.tenant_id == big for r in records) == 2  # its first two turns; the small ones' second
