"""The claim query's plan walks the tenants' due index and fetches picked rows by primary key, never
scanning the table (EXPLAIN of the very SQL text delivery runs)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection

from notifications_retry.delivery import ChannelClaim, ClaimRequest, claim_query
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory

pytestmark = pytest.mark.django_db

TABLE = NotificationEntity._meta.db_table
FAIR_INDEX = "nr_channel_tenant_due_idx"
PRIMARY_KEY = f"{TABLE}_pkey"

_FILL = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(),
       -- ten tenants and the null tenant
       CASE WHEN g %% 11 > 0
           THEN ('00000000-0000-0000-0000-0000000000' || lpad((g %% 11)::text, 2, '0'))::uuid
       END,
       (%(channels)s::bigint[])[1 + (g / 100) %% 2], 'u' || g, '{{}}'::jsonb, '',
       (ARRAY[0, 5, 9])[1 + g %% 3], CASE WHEN g %% 100 = 0 THEN 'failed' ELSE 'sent' END, 1,
       CASE WHEN g %% 100 = 0 THEN %(now)s::timestamptz - interval '1 minute' END, NULL, '', '', '[]'::jsonb,
       '', '', 0, '', %(now)s::timestamptz - interval '1 day', %(now)s::timestamptz - interval '1 day'
FROM generate_series(1, 30000) AS g
"""


def plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def explain(sql, params):
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    document = json.loads(document) if isinstance(document, str) else document
    return list(plan_nodes(document[0]["Plan"]))


@pytest.fixture
def filled(clock):
    channels = [ChannelFactory(key="in_app"), ChannelFactory(key="email", provider_key="stub")]
    with connection.cursor() as cursor:
        cursor.execute(_FILL, {"channels": [c.pk for c in channels], "now": clock.now()})
    return channels


@pytest.mark.parametrize("priorities", [None, [0]], ids=["all", "lane-priorities"])
def test_claim_walks_the_tenants_due_index_and_never_scans_the_table(clock, filled, priorities):
    plan = [ChannelClaim(c.pk, 100, 60.0) for c in filled]
    sql, params = claim_query(clock.now() + timedelta(seconds=1), plan, total=100, priorities=priorities)
    nodes = explain(sql, params)
    on_table = [n for n in nodes if n.get("Relation Name") == TABLE]
    assert on_table, nodes
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Heap Scan") for n in on_table), [
        n["Node Type"] for n in on_table
    ]
    used = {n.get("Index Name") for n in nodes if n.get("Index Name")}
    # Tenants and their rows are walked on the fair index; the picked rows are locked by primary key.
    assert used == {FAIR_INDEX, PRIMARY_KEY}, used
    assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == TABLE for n in nodes)


def test_the_explained_text_is_the_one_claim_due_runs(clock, filled):
    # claim_due builds its statement with claim_query: the same text, so the EXPLAIN above is of it.
    from notifications_retry.delivery import claim as delivery

    seen = []
    original = delivery.claim_query

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        seen.append(result[0])
        return result

    delivery.claim_query = spy
    try:
        batch = delivery.claim_due(
            ClaimRequest(
                clock.now(),
                [ChannelClaim(c.pk, 5, 60.0) for c in filled],
                total=10,
                budgets={c.pk: (5, c.key) for c in filled},
            )
        )
    finally:
        delivery.claim_query = original
    assert len(batch.records) == 10
    assert seen and "FOR UPDATE OF t SKIP LOCKED" in seen[0]


def test_a_claim_of_one_row_reads_it_by_primary_key(clock, filled):
    # The row-by-row claim of a batch the database refused: no walk over the tenants for it.
    row = NotificationEntity.objects.filter(due_at__isnull=False).first()
    sql, params = claim_query(
        clock.now() + timedelta(seconds=1),
        [ChannelClaim(c.pk, 100, 60.0) for c in filled],
        total=1,
        only=row.pk,
    )
    nodes = explain(sql, params)
    assert {n.get("Index Name") for n in nodes if n.get("Index Name")} == {PRIMARY_KEY}
    assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == TABLE for n in nodes)


@pytest.mark.parametrize("leased", [0, 300], ids=["no-lease", "leases-running"])
def test_the_give_back_of_lapsed_leases_probes_the_lease_index_and_never_scans_the_table(
    clock, filled, leased
):
    from notifications_retry.delivery.claim_statements import lapsed_leases_query

    with connection.cursor() as cursor:  # leases running (not lapsed) among the 30,000 rows
        cursor.execute(
            f"UPDATE {TABLE} SET claim_token = gen_random_uuid(), claim_expires_at = %s "
            f"WHERE id IN (SELECT id FROM {TABLE} WHERE status = 'failed' LIMIT %s)",
            [clock.now() + timedelta(minutes=5), leased],
        )
    sql, params = lapsed_leases_query(clock.now(), [c.pk for c in filled])
    nodes = explain(sql, params)
    on_table = [n for n in nodes if n.get("Relation Name") == TABLE]
    assert not any(n["Node Type"] == "Seq Scan" for n in on_table), [n["Node Type"] for n in on_table]
    used = {n.get("Index Name") for n in nodes if n.get("Index Name")}
    assert "nr_lease_expiry_idx" in used and used <= {"nr_lease_expiry_idx", PRIMARY_KEY}, used
