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

# Deadlines outside Python's datetime range ('infinity', year 12000) are clamped in SQL: a deadline
# that far ahead is no deadline, one that far back has passed. A row whose payload would take the
# claim past its payload budget comes back without it, marked over: it is left due, unleased. A row
# over the size limits, or whose payload is not an object, comes back without the value at fault and
# with its measures (row_limits), so the worker never holds it. Three levels: s0 locks the rows and
# tells which are within the budget; s measures those (OFFSET 0: computed once each); the outer
# query returns the values.
CLAIM_SELECT = f"""
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
FROM unnest(%(channels)s::bigint[], %(limits)s::int[], %(leases)s::float8[]) AS c(channel_id, lim, lease)
CROSS JOIN LATERAL (
    SELECT t.*, {{estimate}} AS estimate FROM {_TABLE} t
    WHERE t.channel_id = c.channel_id AND t.due_at IS NOT NULL AND t.due_at <= %(now)s
          {{filters}}
    ORDER BY t.due_at, t.priority
    LIMIT c.lim
    FOR UPDATE OF t SKIP LOCKED
) n
WINDOW w AS (ORDER BY n.due_at, n.priority, n.id ROWS UNBOUNDED PRECEDING)
ORDER BY n.due_at, n.priority, n.id
LIMIT %(total)s
) s0
OFFSET 0
) s
ORDER BY s.due_at, s.priority, s.id
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
