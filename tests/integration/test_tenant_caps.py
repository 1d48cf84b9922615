"""Per-tenant caps in the claim (TenantCaps): a capped tenant gives at most its cap of rows while the
others fill the claim round-robin as before; a held tenant (cap 0) is neither claimed nor read."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from psycopg import AsyncClientCursor

from notifications_retry.delivery import (
    ChannelClaim,
    ClaimRequest,
    TenantCaps,
    claim_due,
    claim_due_async,
    claim_query,
)
from notifications_retry.delivery.claim_statements import CLAIM_SELECT
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory
from tests.support.due_rows import due_rows as due

pytestmark = pytest.mark.django_db

TABLE = NotificationEntity._meta.db_table
Status = NotificationEntity.Status
Priority = NotificationEntity.Priority
A, B, C, H = (uuid.UUID(int=n) for n in (0xA, 0xB, 0xC, 0xD))


_BACKLOG = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), %(tenant)s, %(channel)s, 'u' || g, '{{}}'::jsonb, '', %(priority)s, 'failed', 1,
       %(first)s::timestamptz + g * interval '1 millisecond', NULL, '', '', '[]'::jsonb, '', '', 0, '',
       %(first)s::timestamptz, %(first)s::timestamptz
FROM generate_series(1, %(count)s) AS g
"""


def backlog(channel, tenant, count, *, first, priority=Priority.LOW):
    """``count`` due rows of ``tenant`` in one statement (fast), a millisecond apart from ``first`` on."""
    with connection.cursor() as cursor:
        cursor.execute(
            _BACKLOG,
            {"tenant": tenant, "channel": channel.pk, "priority": priority, "first": first, "count": count},
        )


def plan_of(channels, limit, caps):
    return [ChannelClaim(c.pk, limit, 60.0, tenant_caps=caps.get(c.pk)) for c in channels]


def claim(clock, channels, limit, caps, *, total=None, **kwargs):
    """Claim ``limit`` rows of each channel, ``caps`` mapping a channel's id to its TenantCaps."""
    budgets = {c.pk: (c.max_attempts, c.key) for c in channels}
    total = total if total is not None else limit * len(channels)
    plan = plan_of(channels, limit, caps)
    return claim_due(ClaimRequest(clock.now(), plan, total=total, budgets=budgets, **kwargs)).records


def picked(now, plan, **kwargs):
    """The ids a claim would take, in order, without locking or leasing them."""
    sql, params = claim_query(now, plan, total=sum(p.limit for p in plan), **kwargs)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM ({sql.replace('FOR UPDATE OF t SKIP LOCKED', '')}) AS due", params)
        return [row[0] for row in cursor.fetchall()]


def test_a_capped_tenant_gives_its_cap_while_the_others_fill_the_claim_round_robin(clock):
    channel = ChannelFactory(key="in_app")
    rows_a = due(clock, channel, A, 10, ago=3600)
    rows_b = due(clock, channel, B, 10, ago=600)
    rows_c = due(clock, channel, C, 10, ago=60)
    records = claim(clock, [channel], 8, {channel.pk: TenantCaps(caps={A: 2})})
    # A's two turns, then B and C alone take the rounds A would have had its share of.
    assert [r.id for r in records] == [
        rows_a[0].pk, rows_b[0].pk, rows_c[0].pk,
        rows_a[1].pk, rows_b[1].pk, rows_c[1].pk,
        rows_b[2].pk, rows_c[2].pk,
    ]  # fmt: skip


def test_capped_tenants_leave_the_picks_to_the_others_rather_than_fill_them_with_their_surplus(clock):
    """Picks are a multiple of the limit, shared by the tenants round after round: capped tenants stop
    at their cap in the picks themselves, so their surplus never takes the place of others' rows."""
    channel = ChannelFactory(key="in_app")
    capped = [uuid.UUID(int=0x100 + i) for i in range(6)]
    rows = {tenant: due(clock, channel, tenant, 10, ago=3600 - 60 * i) for i, tenant in enumerate(capped)}
    rows_b = due(clock, channel, B, 30, ago=60)
    records = claim(clock, [channel], 20, {channel.pk: TenantCaps(default=2, caps={B: 1000})})
    assert [r.id for r in records] == [
        *(rows[t][0].pk for t in capped), rows_b[0].pk,
        *(rows[t][1].pk for t in capped), rows_b[1].pk,
        *(r.pk for r in rows_b[2:8]),
    ]  # fmt: skip


def test_the_default_caps_every_unnamed_tenant_and_a_named_cap_overrides_it_up_or_down(clock):
    channel = ChannelFactory(key="in_app")
    rows_a = due(clock, channel, A, 10, ago=3600)
    rows_b = due(clock, channel, B, 10, ago=600)
    rows_c = due(clock, channel, C, 10, ago=60)
    caps = TenantCaps(default=2, caps={A: 4, B: 1})
    records = claim(clock, [channel], 20, {channel.pk: caps})
    assert [r.id for r in records] == [
        rows_a[0].pk, rows_b[0].pk, rows_c[0].pk,
        rows_a[1].pk, rows_c[1].pk,
        rows_a[2].pk,
        rows_a[3].pk,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("caps", "of_a"),
    [(TenantCaps(caps={None: 2}), 6), (TenantCaps(default=2), 2)],
    ids=["named", "default"],
)
def test_the_null_tenant_is_capped_by_its_own_cap_or_else_the_default(clock, caps, of_a):
    channel = ChannelFactory(key="in_app")
    rows_null = due(clock, channel, None, 10, ago=3600)
    rows_a = due(clock, channel, A, 10, ago=600)
    records = claim(clock, [channel], 8, {channel.pk: caps})
    assert [r.id for r in records if r.tenant_id is None] == [r.pk for r in rows_null[:2]]
    assert [r.id for r in records if r.tenant_id == A] == [r.pk for r in rows_a[:of_a]]


def test_a_cap_of_zero_holds_a_tenant_none_of_its_rows_is_leased(clock):
    channel = ChannelFactory(key="in_app")
    rows_a = due(clock, channel, A, 5, ago=3600)
    rows_null = due(clock, channel, None, 5, ago=1800)
    rows_b = due(clock, channel, B, 5, ago=60)
    before = {r.pk: r.due_at for r in NotificationEntity.objects.filter(tenant_id=A)}
    records = claim(clock, [channel], 10, {channel.pk: TenantCaps(caps={A: 0})})
    assert [r.id for r in records] == [r.pk for pair in zip(rows_null, rows_b, strict=True) for r in pair]
    held = NotificationEntity.objects.filter(pk__in=[r.pk for r in rows_a])
    assert {r.pk: r.due_at for r in held} == before
    assert all(r.claim_token is None and r.attempts == 1 for r in held)
    assert NotificationEntity.objects.filter(tenant_id=B, claim_token__isnull=False).count() == 5
    # Held through the default, the null tenant and every unnamed tenant alike; a named one is not.
    due(clock, channel, None, 2, ago=30)
    due(clock, channel, C, 2, ago=30)
    records = claim(clock, [channel], 10, {channel.pk: TenantCaps(default=0, caps={A: 1})})
    assert [r.id for r in records] == [rows_a[0].pk]


def claim_buffers(now, plan, **kwargs):
    """Shared buffers the claim's statement touches (EXPLAIN ANALYZE, BUFFERS), and the ids it locked."""
    sql, params = claim_query(now, plan, total=sum(p.limit for p in plan), **kwargs)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    document = json.loads(document) if isinstance(document, str) else document
    top = document[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


@pytest.mark.parametrize("held", [H, None], ids=["tenant", "null-tenant"])
def test_a_held_tenants_backlog_is_not_read_and_takes_nothing_from_the_others(clock, held):
    """A held tenant's backlog ahead of the others' rows costs the walk one entry at most: none of its
    rows is read, so the claim's reads do not grow with it. Its rows are all of another lane's priority
    but the last few: were it not held, the claim would read its whole backlog for its first row of
    the lane."""
    channel = ChannelFactory(key="in_app")
    now = clock.now()
    backlog(channel, held, 500, first=now - timedelta(hours=5))
    held_high = due(clock, channel, held, 3, ago=3 * 3600, priority=Priority.HIGH)
    rows_b = due(clock, channel, B, 5, ago=600, priority=Priority.HIGH)
    rows_c = due(clock, channel, C, 5, ago=60, priority=Priority.HIGH)
    expected = [r.pk for pair in zip(rows_b, rows_c, strict=True) for r in pair]
    plan = plan_of([channel], 10, {channel.pk: TenantCaps(caps={held: 0})})
    lane = {"priorities": [Priority.HIGH]}
    # Not held, its rows of the lane would come first: the case is one where holding it matters.
    assert picked(now, plan_of([channel], 10, {}), **lane)[0] == held_high[0].pk
    assert picked(now, plan, **lane) == expected
    small = claim_buffers(now, plan, **lane)
    backlog(channel, held, 4500, first=now - timedelta(hours=4))
    assert NotificationEntity.objects.filter(tenant_id=held).count() == 5003
    large = claim_buffers(now, plan, **lane)
    # Reading the 4,500 more entries (and their rows, not yet all-visible) would cost hundreds more.
    assert large <= small + 20, (small, large)
    assert picked(now, plan, **lane) == expected
    records = claim(clock, [channel], 10, {channel.pk: TenantCaps(caps={held: 0})}, **lane)
    assert [r.id for r in records] == expected


def test_two_channels_of_one_plan_cap_the_same_tenant_each_by_its_own_caps(clock):
    mail = ChannelFactory(key="email", provider_key="stub")
    app = ChannelFactory(key="in_app")
    push = ChannelFactory(key="push", provider_key="stub")
    rows = {}
    for channel in (mail, app, push):
        rows[channel.pk, A] = due(clock, channel, A, 10, ago=3600)
        rows[channel.pk, B] = due(clock, channel, B, 10, ago=60)
    caps = {mail.pk: TenantCaps(caps={A: 1}), app.pk: TenantCaps(default=2, caps={B: 5})}
    records = claim(clock, [mail, app, push], 6, caps)
    got = {
        (channel.pk, tenant): [r.id for r in records if r.channel_id == channel.pk and r.tenant_id == tenant]
        for channel in (mail, app, push)
        for tenant in (A, B)
    }
    expected = {(mail.pk, A): 1, (mail.pk, B): 5, (app.pk, A): 2, (app.pk, B): 4, (push.pk, A): 3}
    expected[push.pk, B] = 3  # push has no caps: round-robin alone
    assert got == {key: [r.pk for r in rows[key][:count]] for key, count in expected.items()}


def test_a_claim_of_one_row_refuses_a_held_tenants_row(clock):
    channel = ChannelFactory(key="in_app")
    row_a = due(clock, channel, A, 1, ago=60)[0]
    row_b = due(clock, channel, B, 1, ago=60)[0]
    row_null = due(clock, channel, None, 1, ago=60)[0]
    now = clock.now()
    caps = TenantCaps(default=1, caps={A: 0, None: 0})
    plan = plan_of([channel], 5, {channel.pk: caps})
    assert picked(now, plan, only=row_a.pk) == []
    assert picked(now, plan, only=row_null.pk) == []
    assert picked(now, plan, only=row_b.pk) == [row_b.pk]
    assert picked(now, plan_of([channel], 5, {}), only=row_a.pk) == [row_a.pk]


def test_no_caps_claims_as_without_them(clock):
    channel = ChannelFactory(key="in_app")
    due(clock, channel, A, 30, ago=3600)
    due(clock, channel, None, 4, ago=1800, priority=Priority.HIGH)
    due(clock, channel, B, 7, ago=600, spread=0)
    due(clock, channel, C, 2, ago=60)
    now = clock.now()
    without = picked(now, [ChannelClaim(channel.pk, 20, 60.0)])
    assert len(without) == 20
    # No cap at all is no caps: the very statement without them.
    sql, _ = claim_query(now, plan_of([channel], 20, {channel.pk: TenantCaps()}), total=20)
    assert sql == claim_query(now, plan_of([channel], 20, {}), total=20)[0]
    assert "caps" not in CLAIM_SELECT
    # Caps that cap none of these tenants: the statement with caps, the very same claim.
    for caps in (
        TenantCaps(),
        TenantCaps(caps={uuid.UUID(int=0xE): 1}),
        TenantCaps(default=100, caps={A: 50}),
    ):
        assert picked(now, plan_of([channel], 20, {channel.pk: caps})) == without, caps


def test_with_caps_the_claim_still_walks_the_due_index_and_locks_by_primary_key(clock):
    channel = ChannelFactory(key="in_app")
    for tenant in (A, B, C, H):
        backlog(channel, tenant, 500, first=clock.now() - timedelta(hours=1))
    backlog(channel, None, 500, first=clock.now() - timedelta(hours=1))
    plan = plan_of([channel], 50, {channel.pk: TenantCaps(default=5, caps={H: 0, None: 3})})
    sql, params = claim_query(clock.now(), plan, total=50)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    document = json.loads(document) if isinstance(document, str) else document
    nodes, todo = [], [document[0]["Plan"]]
    while todo:
        nodes.append(todo.pop())
        todo += nodes[-1].get("Plans", [])
    on_table = [n for n in nodes if n.get("Relation Name") == TABLE]
    assert on_table and all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in on_table), nodes
    assert {n.get("Index Name") for n in on_table} == {"nr_channel_tenant_due_idx", f"{TABLE}_pkey"}
    records = claim(clock, [channel], 50, {channel.pk: TenantCaps(default=5, caps={H: 0, None: 3})})
    counts = {t: sum(r.tenant_id == t for r in records) for t in (A, B, C, H, None)}
    assert counts == {A: 5, B: 5, C: 5, H: 0, None: 3}


@pytest.mark.django_db(transaction=True)
def test_the_claim_on_an_asynchronous_connection_honours_the_caps_too(clock):
    channel = ChannelFactory(key="in_app")
    rows_a = due(clock, channel, A, 5, ago=3600)
    due(clock, channel, B, 5, ago=600)
    rows_c = due(clock, channel, C, 5, ago=60)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    plan = plan_of([channel], 6, {channel.pk: TenantCaps(caps={A: 1, B: 0})})

    async def run():
        conn = await psycopg.AsyncConnection.connect(
            **params, autocommit=True, cursor_factory=AsyncClientCursor
        )
        async with conn:
            budgets = {channel.pk: (channel.max_attempts, channel.key)}
            request = ClaimRequest(clock.now(), plan, total=6, budgets=budgets, max_payload_bytes=1_000_000)
            return await claim_due_async(conn, request)

    batch = asyncio.run(run())
    assert [r.id for r in batch.records] == [rows_a[0].pk, *(r.pk for r in rows_c)]
    assert NotificationEntity.objects.filter(claim_token__isnull=False).count() == 6
