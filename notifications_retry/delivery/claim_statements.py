"""The claim's SQL statements (run by :mod:`.claim`): what is selected and locked, and the lease update."""

from __future__ import annotations

from notifications_retry.delivery import row_limits
from notifications_retry.models import NotificationEntity

_TABLE = NotificationEntity._meta.db_table

# A payload's size without reading it: what the row stores (at most twice the limit: a larger one is
# never read, see row_limits), unless compressed, when it counts as the largest payload accepted (a
# compressed value's stored size says little of its real one).
# pg_column_compression() is PostgreSQL 14+. On 13 every payload counts as 90 times what it stores, at
# most the largest accepted: pglz, 13's only method, cannot shrink data more than about 88 to 1.
ESTIMATE_14 = (
    "CASE WHEN pg_column_compression(t.payload) IS NULL "
    "THEN LEAST(pg_column_size(t.payload), 2 * %(max_payload)s) ELSE %(max_payload)s END"
)
ESTIMATE_13 = "LEAST(90::bigint * pg_column_size(t.payload), %(max_payload)s)"

#: Tenants a claim visits per channel at most. Up to this many tenants with rows in a channel's due
#: index, every claim visits them all; past it, each claim visits this many in a row of the tenant ids'
#: ring, starting at a point drawn from the claim's time, so over claims every tenant's turn comes.
TENANTS_PER_CLAIM = 1000

#: Rows a claim picks per channel before locking, as a multiple of the channel's limit: a row another
#: claim has just locked (the claim thread's claim beside this one) is skipped and the next one taken.
PICK_FACTOR = 2


def _next_row(after: bool) -> str:
    """A tenant's next due row in claim order (one index descent): its first, or the one after ``p``'s.

    Two branches, one of which finds nothing at once: ``t.tenant_id = p.tenant_id`` matches no null,
    so the null tenant (a tenant of its own) has a branch of its own, gated on ``p.tenant_id IS NULL``.
    """
    position = "AND (t.due_at, t.priority, t.id) > (p.due_at, p.priority, p.id)" if after else ""
    rows = f"""
        SELECT t.id, t.due_at, t.priority FROM {_TABLE} t
        WHERE t.channel_id = p.channel_id AND {{tenant}}
              AND t.due_at IS NOT NULL AND t.due_at <= %(now)s {position} {{{{filters}}}}
        ORDER BY t.tenant_id, t.due_at, t.priority, t.id  -- nr_channel_tenant_due_idx's order
        LIMIT 1"""
    return (
        f"({rows.format(tenant='t.tenant_id = p.tenant_id')})\n        UNION ALL\n"
        f"        ({rows.format(tenant='p.tenant_id IS NULL AND t.tenant_id IS NULL')})"
    )


def _next_tenant(bound: str) -> str:
    """The first tenant id of a channel's due index past ``bound`` (one index descent)."""
    return f"""(SELECT t.tenant_id FROM {_TABLE} t
            WHERE t.channel_id = r.channel_id AND t.due_at IS NOT NULL AND {bound}
            ORDER BY t.tenant_id LIMIT 1)"""


# Rows are picked round-robin across a channel's tenants (the null tenant is one of its own), oldest
# due first within each: the claim takes every tenant's first due row, then every tenant's second, and
# so on; ``turn`` is a row's rank in its tenant. A tenant with a huge backlog so delays another
# tenant's due rows by one claim at most. Each step is an index descent on nr_channel_tenant_due_idx,
# whatever the backlog: ``ring`` walks the distinct tenant ids of the channel's due index (a skip
# scan, wrapping round from a start drawn from the claim's time, TENANTS_PER_CLAIM at most); ``picks``
# takes each tenant's next row, round after round, until PICK_FACTOR times the channel's limit is
# picked (``taken`` counts the rows picked so far). Then the rows are locked, in (turn, due_at,
# priority) order, skipping rows another claim holds, up to the channel's limit.
#
# Deadlines outside Python's datetime range ('infinity', year 12000) are clamped in SQL: a deadline
# that far ahead is no deadline, one that far back has passed. A row whose payload would take the
# claim past its payload budget comes back without it, marked over: it is left due, unleased. A row
# over the size limits, or whose payload is not an object, comes back without the value at fault and
# with its measures (row_limits), so the worker never holds it. Three levels: s0 locks the rows and
# tells which are within the budget; s measures those (OFFSET 0: computed once each); the outer
# query returns the values.
CLAIM_SELECT = f"""
WITH RECURSIVE c AS MATERIALIZED (
    SELECT * FROM unnest(%(channels)s::bigint[], %(limits)s::int[], %(leases)s::float8[])
        AS c(channel_id, lim, lease)
), ring(channel_id, tenant_id, n, wrapped) AS (
    SELECT r.channel_id, x.tenant_id, 1, x.wrapped
    FROM c r CROSS JOIN LATERAL (
        SELECT f.tenant_id, false AS wrapped FROM {_next_tenant("t.tenant_id >= %(start)s")} f(tenant_id)
        UNION ALL
        SELECT f.tenant_id, true FROM {_next_tenant("t.tenant_id < %(start)s")} f(tenant_id)
        LIMIT 1
    ) x
    WHERE x.tenant_id IS NOT NULL
    UNION ALL
    SELECT r.channel_id, x.tenant_id, r.n + 1, x.wrapped
    FROM ring r
    CROSS JOIN LATERAL (
        SELECT CASE WHEN r.wrapped
                    THEN {_next_tenant("t.tenant_id > r.tenant_id AND t.tenant_id < %(start)s")}
                    ELSE {_next_tenant("t.tenant_id > r.tenant_id")} END AS up
        OFFSET 0  -- evaluated once: read twice below
    ) u
    CROSS JOIN LATERAL (
        SELECT COALESCE(u.up, CASE WHEN NOT r.wrapped THEN {_next_tenant("t.tenant_id < %(start)s")} END)
                   AS tenant_id,
               r.wrapped OR u.up IS NULL AS wrapped
    ) x
    WHERE x.tenant_id IS NOT NULL AND r.n < %(tenants)s
), picks(channel_id, lim, tenant_id, id, due_at, priority, turn, taken) AS (
    SELECT p.channel_id, p.lim, p.tenant_id, x.id, x.due_at, x.priority, 1,
           count(*) OVER (PARTITION BY p.channel_id)
    FROM (SELECT c.channel_id, c.lim, r.tenant_id FROM c JOIN ring r USING (channel_id)
          UNION ALL
          SELECT c.channel_id, c.lim, NULL::uuid FROM c) p
    CROSS JOIN LATERAL ({_next_row(after=False)}
    ) x
    UNION ALL
    SELECT p.channel_id, p.lim, p.tenant_id, x.id, x.due_at, x.priority, p.turn + 1,
           p.taken + count(*) OVER (PARTITION BY p.channel_id)
    FROM picks p CROSS JOIN LATERAL ({_next_row(after=True)}
    ) x
    WHERE p.taken < p.lim * {PICK_FACTOR}
)
SELECT s.id, s.tenant_id, s.channel_id,
       CASE WHEN {row_limits.RECIPIENT_RETURNED} THEN s.recipient END,
       CASE WHEN {row_limits.PAYLOAD_RETURNED} THEN s.payload END,
       s.notification_type, s.priority, s.status, s.attempts,
       CASE WHEN s.expires_at IS NOT NULL THEN LEAST(GREATEST(s.expires_at,
           '0001-01-02 00:00+00'::timestamptz), '9999-12-30 00:00+00'::timestamptz) END,
       s.correlation_id, s.requeue_count, s.lease, s.recovered, s.crashes, NOT s.within AS over_budget,
       s.shape, s.text_size, s.recipient_chars
FROM (
SELECT s0.*, {row_limits.MEASURES}
FROM (
SELECT n.*, c.lease, n.claim_token IS NOT NULL AS recovered,
       -- A recovered row's attempts that never finished (counted at claim, never logged): its crashes.
       CASE WHEN n.claim_token IS NOT NULL THEN n.attempts - (
           SELECT count(*) FROM jsonb_array_elements(n.attempt_log) e
           WHERE (e->>'generation')::int = n.requeue_count) END AS crashes,
       sum(n.estimate) OVER w - n.estimate < %(budget)s AS within
FROM c
CROSS JOIN LATERAL (
    SELECT t.*, {{estimate}} AS estimate, p.turn FROM picks p JOIN {_TABLE} t ON t.id = p.id
    -- Checked again on the row as locked (a claim beside this one may have leased it since). IS TRUE:
    -- no due index can serve it, so each picked row is fetched by its primary key, never by a walk
    -- of the channel's due rows.
    WHERE p.channel_id = c.channel_id AND (t.channel_id = c.channel_id AND t.due_at <= %(now)s) IS TRUE
          {{filters}}
    ORDER BY p.turn, t.due_at, t.priority, t.id
    LIMIT c.lim
    FOR UPDATE OF t SKIP LOCKED
) n
WINDOW w AS (ORDER BY n.turn, n.due_at, n.priority, n.id ROWS UNBOUNDED PRECEDING)
ORDER BY n.turn, n.due_at, n.priority, n.id
LIMIT %(total)s
) s0
OFFSET 0
) s
ORDER BY s.turn, s.due_at, s.priority, s.id
"""

# Ids and lease lengths travel as comma-joined text: a psycopg array parameter is quoted element by
# element in Python (a datetime costs more than its row's share of the statement).
CLAIM_UPDATE = f"""
UPDATE {_TABLE} t
SET attempts = t.attempts + 1, claim_token = %(token)s,
    claim_expires_at = %(now)s + v.lease * interval '1 second', updated_at = %(now)s,
    due_at = %(now)s + v.lease * interval '1 second'  -- db_rules.DUE_AT_RULE: due at its lease's end
FROM unnest(string_to_array(%(ids)s, ',')::uuid[], string_to_array(%(leases)s, ',')::float8[])
     AS v(id, lease)
WHERE t.id = v.id
"""
