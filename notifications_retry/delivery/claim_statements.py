"""The claim's SQL statements (run by :mod:`.claim`): what is selected and locked, and the lease update;
the size and shape limits a claimed row is held to; the give-back of lapsed leases (below);
the claim's request and plan (:class:`ClaimRequest`, :class:`ChannelClaim`, :class:`Partitions`) and
:func:`claim_query`, which builds the SELECT from them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import connection

from notifications_retry.conf import bounds, get_settings
from notifications_retry.delivery.session import json_document
from notifications_retry.models import NotificationEntity
from notifications_retry.rules.outcomes import PAYLOAD_INVALID, PAYLOAD_TOO_LARGE, Failure

# --------------------------------------------------------------------------------------------------
# The limits every claimed row is held to, not only the rows the API wrote.
#
# Raw SQL, a restore or a bad migration can leave a 50 MB payload, a 10 MB recipient or a payload that is
# not a JSON object. The claim measures them in SQL and returns neither value for such a row, so the worker
# never holds it in memory; :func:`set_aside` then says why the row is a dead letter (``payload_too_large``,
# ``payload_invalid``): no provider call, one event.
#
# Sizes are the API's (:func:`notifications_retry.inputs.validation.check_payload`): the payload as compact
# JSON in UTF-8, at most ``MAX_PAYLOAD_BYTES``; the recipient at most ``RECIPIENT_MAX_LENGTH`` characters.
# PostgreSQL prints a payload with a space after each ``:`` and ``,``, so its text is at most twice the
# compact form: a payload whose text is over twice the limit is refused unread, and one between the limit
# and twice it is read (at most twice ``MAX_PAYLOAD_BYTES``) and measured exactly as the API measures.
# --------------------------------------------------------------------------------------------------

RECIPIENT_MAX_LENGTH = bounds.RECIPIENT_MAX_LENGTH
#: lz4 and pglz shrink data at most about 255 and 88 to 1: a stored payload smaller than the limit
#: divided by this cannot be over the limit, and is not measured further.
MAX_COMPRESSION_RATIO = 256

#: The claim's measures, computed in its middle query for the rows within its payload budget only
#: (``s0``: the locked rows with ``within``); ``OFFSET 0`` there keeps each computed once.
MEASURES = f"""
       CASE WHEN s0.within THEN jsonb_typeof(s0.payload) END AS shape,
       CASE WHEN s0.within AND pg_column_size(s0.payload)::bigint * {MAX_COMPRESSION_RATIO} > %(max_payload)s
            THEN octet_length(s0.payload::text) END AS text_size,
       CASE WHEN octet_length(s0.recipient) > {RECIPIENT_MAX_LENGTH} THEN char_length(s0.recipient) END
            AS recipient_chars
"""

#: Whether the claim returns a row's payload: within the budget, an object, not over twice the limit.
PAYLOAD_RETURNED = (
    "s.within AND s.shape = 'object' AND (s.text_size IS NULL OR s.text_size <= 2 * %(max_payload)s)"
)
#: Whether it returns the recipient: not over the limit.
RECIPIENT_RETURNED = f"s.recipient_chars IS NULL OR s.recipient_chars <= {RECIPIENT_MAX_LENGTH}"


def set_aside(
    *, shape: str | None, text_size: int | None, recipient_chars: int | None, payload: Any, max_payload: int
) -> Failure | None:
    """Why a claimed row is not sent at all (its measures from the claim), or None when it may be."""
    if recipient_chars is not None and recipient_chars > RECIPIENT_MAX_LENGTH:
        return Failure(
            PAYLOAD_TOO_LARGE,
            f"recipient is {recipient_chars:,} characters; at most {RECIPIENT_MAX_LENGTH:,} are accepted "
            "(written past the API: nothing was sent)",
            retriable=False,
        )
    if shape is not None and shape != "object":
        return Failure(
            PAYLOAD_INVALID,
            f"payload is a JSON {shape}, not an object (written past the API: nothing was sent)",
            retriable=False,
        )
    if text_size is None or text_size <= max_payload:
        return None
    size = text_size if text_size > 2 * max_payload else _compact_size(payload)
    if size <= max_payload:
        return None
    measured = "as stored" if size == text_size else "as JSON"
    return Failure(
        PAYLOAD_TOO_LARGE,
        f"payload is {size:,} bytes {measured}; at most {max_payload:,} are accepted (MAX_PAYLOAD_BYTES; "
        "written past the API: nothing was sent)",
        retriable=False,
    )


def _compact_size(payload: Any) -> int:
    """The payload's size as the API measures it: compact JSON in UTF-8."""
    encoded = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return len(encoded.encode("utf-8", "surrogatepass"))


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

# A row's partition (PARTITIONS above 1, database.locks): PostgreSQL's hash of the uuid, the one hash
# partitioning uses, so it is stable across versions and upgrades; the sign bit is masked off (abs() of the
# smallest bigint overflows). Computed from the row: no column, no migration. By id, not by tenant: a
# big tenant's backlog spreads over every partition (its fairness is the claim's order's business).
PARTITION_OF = "mod(uuid_hash_extended({row}.id, 0) & 9223372036854775807, %(partition_count)s::bigint)"

#: Tenants a claim visits per channel at most. The walk over a channel's tenants also stops once it
#: found PICK_FACTOR times the channel's limit of tenants with a due row (round one alone fills the
#: claim then). Past either bound, claims at other times start the walk elsewhere on the ring of tenant
#: ids (a start drawn from the claim's time), so every tenant's turn comes.
TENANTS_PER_CLAIM = 1000

#: Rows a claim picks per channel before locking, as a multiple of the channel's limit: a row another
#: claim has just locked (the claim beside this one, on the worker's second connection) is skipped and
#: the next one taken.
PICK_FACTOR = 2


def _first_row(tenant: str, after: str = "", limit: str = "1") -> str:
    """A tenant's first due rows in claim order (``limit`` of them), or its first after ``after``'s: one
    range of nr_channel_tenant_due_idx, whose order the ORDER BY follows."""
    position = (
        f"AND (t.due_at, t.priority, t.id) > ({after}.due_at, {after}.priority, {after}.id)" if after else ""
    )
    return f"""
        SELECT t.id, t.due_at, t.priority FROM {_TABLE} t
        WHERE t.channel_id = c.channel_id AND {tenant}
              AND t.due_at IS NOT NULL AND t.due_at <= %(now)s {position} {{filters}}
        ORDER BY t.tenant_id, t.due_at, t.priority, t.id
        LIMIT {limit}"""


#: Entries of the due index one step of the walk over tenants reads: one descent, then this many in a
#: row, so tenants of a few rows each are found many to a step, and a large one costs one step.
TENANT_STEP = 16


def _tenants_after(gate: str, bound: str, wrapped: str) -> str:
    """The next TENANT_STEP entries of the channel's due index within ``bound``; ``ok``: the entry is
    due and passes the claim's filters."""
    return f"""(SELECT {wrapped} AS wrapped, t.tenant_id, t.id, t.due_at, t.priority,
                       (t.due_at <= %(now)s {{filters}}) AS ok
                FROM {_TABLE} t
                WHERE {gate} AND t.channel_id = c.channel_id AND t.due_at IS NOT NULL AND {bound}
                ORDER BY t.tenant_id, t.due_at, t.priority, t.id LIMIT {TENANT_STEP})"""


# A round's rows per tenant: what is left to pick, shared among the tenants of the round before.
_CHUNK = f"ceil((c.lim * {PICK_FACTOR} - c.taken)::float8 / c.active)::int"

# Per-tenant caps (TenantCaps), when a plan has some: the statement takes the fragments below, else it
# is the text without caps (and so the same plan). The caps travel as one jsonb object (caps_parameter)
# whose keys are found by bisection, cheap however many tenants are named (an array would be scanned
# per lookup). A tenant's cap is looked up once, where the walk meets it, and goes with its picks.
_CAPS_CTE = "), caps AS MATERIALIZED (SELECT %(tenant_caps)s::jsonb AS m\n"


def _cap_of(channel: str, tenant: str) -> str:
    """SQL: ``tenant``'s cap on ``channel``, its own else the channel's default (NULL: no cap)."""
    named = f"({channel}::text || '/' || COALESCE({tenant}::text, ''))"
    return f"COALESCE((SELECT m FROM caps) ->> {named}, (SELECT m FROM caps) ->> {channel}::text)::int"


# Rows are picked round-robin across a channel's tenants (the null tenant is one of its own), oldest
# due first within each: the claim takes every tenant's first due row, then every tenant's second, and
# so on; ``turn`` is a row's rank in its tenant. A tenant with a huge backlog so delays another
# tenant's due rows by one claim at most. Each step is an index descent on nr_channel_tenant_due_idx,
# whatever the backlog:
# - ``ring`` walks the distinct tenant ids of the channel's due index, TENANT_STEP entries a step, each
#   step starting past the last tenant of the one before (a skip scan), wrapping round from a start
#   drawn from the claim's time; it takes each tenant's first due row (the step's entry, unless the
#   filters refuse it). ``n`` counts the tenants visited, ``found`` those with a due row, ``last`` marks
#   a step's last tenant: the walk stops at TENANTS_PER_CLAIM tenants, or PICK_FACTOR times the limit
#   found;
# - ``picks`` starts from those first rows (and the null tenant's), then round after round takes each
#   tenant's next rows, as many for each (_CHUNK), until PICK_FACTOR times the channel's limit is picked
#   (``taken``); a row's ``turn`` is its rank in its tenant, ``last`` marks a tenant's last row so far,
#   ``active`` counts the tenants of the round. Every step names the row in hand ``c``: its channel_id
#   is the one _first_row and _tenants_after read;
# - then the picks are locked, in (turn, due_at, priority) order, skipping rows another claim holds,
#   up to the channel's limit (CLAIM_SELECT, below).
# With caps, a held tenant (cap 0) has no first row and is not found: the conditions are on the walk's
# row alone, so PostgreSQL skips the lookup outright (a one-time filter) and never reads its backlog. A
# tenant goes on to another round only under its cap (``last``), for at most what the cap leaves.
def _fair_picks(capped: bool) -> str:
    def on(fragment: str) -> str:
        return fragment if capped else ""

    col, unheld, first_on = on(", cap"), on(" AND x.cap IS DISTINCT FROM 0"), on("COALESCE(f.cap > 1, true)")
    goes_on = "x.pos = x.size" + on(" AND COALESCE(c.turn + x.pos < c.cap, true)")
    chunk = f"LEAST({_CHUNK}, c.cap - c.turn)" if capped else _CHUNK
    null_cap = on(f"CROSS JOIN LATERAL (SELECT {_cap_of('c.channel_id', 'NULL')} AS cap) k ")
    step_cap = on(f", {_cap_of('c.channel_id', 'b.tenant_id')} AS cap")
    null_first = _first_row(on("k.cap IS DISTINCT FROM 0 AND ") + "t.tenant_id IS NULL")
    first_active = on(f" FILTER (WHERE {first_on})")
    return f"""
{on(_CAPS_CTE)}), ring(channel_id, lim, tenant_id, wrapped, last, n, found, id, due_at, priority{col}) AS (
    -- The walk's cursor before its first step: at the start, no tenant of its own.
    SELECT c.channel_id, c.lim, %(start)s::uuid, false, true, 0::bigint, 0::bigint,
           NULL::uuid, NULL::timestamptz, NULL::smallint{on(", NULL::int")}
    FROM c
    UNION ALL
    SELECT c.channel_id, c.lim, x.tenant_id, x.wrapped, x.last,
           c.n + count(*) OVER w, c.found + count(f.id) OVER w, f.id, f.due_at, f.priority{on(", x.cap")}
    FROM ring c
    CROSS JOIN LATERAL (
        -- Each tenant's first entry in the step (its first in the index: a step starts past a tenant).
        SELECT b.*, row_number() OVER (ORDER BY b.wrapped DESC, b.tenant_id DESC) = 1 AS last{step_cap}
        FROM (SELECT DISTINCT ON (e.wrapped, e.tenant_id) e.* FROM (
            -- Past the cursor up to the end of the ids, then round from the lowest up to the start.
            {_tenants_after("NOT c.wrapped", "t.tenant_id > c.tenant_id", "false")}
            UNION ALL
            {_tenants_after("NOT c.wrapped", "t.tenant_id <= %(start)s", "true")}
            UNION ALL
            {_tenants_after("c.wrapped", "t.tenant_id > c.tenant_id AND t.tenant_id <= %(start)s", "true")}
            LIMIT LEAST({TENANT_STEP}, %(tenants)s - c.n)
        ) e ORDER BY e.wrapped, e.tenant_id, e.due_at, e.priority, e.id) b
    ) x
    -- That entry is the tenant's first due row when it is due and passes the filters; when only the
    -- filters refused it, the tenant's first row that passes them is looked for.
    LEFT JOIN LATERAL (
        SELECT x.id, x.due_at, x.priority WHERE x.ok{unheld}
        UNION ALL
        ({_first_row(f"NOT x.ok{unheld} AND x.due_at <= %(now)s AND t.tenant_id = x.tenant_id")})
    ) f ON true
    WHERE c.last AND c.n < %(tenants)s AND c.found < c.lim * {PICK_FACTOR}
    WINDOW w AS (PARTITION BY c.channel_id)
), picks(channel_id, lim, tenant_id, id, due_at, priority, turn, last, taken, active{col}) AS (
    SELECT f.channel_id, f.lim, f.tenant_id, f.id, f.due_at, f.priority, 1, {first_on or "true"},
           count(*) OVER w, count(*){first_active} OVER w{on(", f.cap")}
    FROM (SELECT channel_id, lim, tenant_id, id, due_at, priority{col} FROM ring WHERE id IS NOT NULL
          UNION ALL
          SELECT c.channel_id, c.lim, NULL, x.id, x.due_at, x.priority{on(", k.cap")}
          FROM c {null_cap}CROSS JOIN LATERAL ({null_first}
          ) x) f
    WINDOW w AS (PARTITION BY f.channel_id)
    UNION ALL
    SELECT c.channel_id, c.lim, c.tenant_id, x.id, x.due_at, x.priority,
           (c.turn + x.pos)::int, {goes_on},
           c.taken + count(*) OVER w, count(*) FILTER (WHERE {goes_on}) OVER w{on(", c.cap")}
    FROM picks c CROSS JOIN LATERAL (
        SELECT y.*, row_number() OVER (ORDER BY y.due_at, y.priority, y.id) AS pos, count(*) OVER () AS size
        FROM (
            -- t.tenant_id = NULL matches nothing: the null tenant's rows have a branch of their own.
            ({_first_row("t.tenant_id = c.tenant_id", after="c", limit=chunk)})
            UNION ALL
            ({_first_row("c.tenant_id IS NULL AND t.tenant_id IS NULL", after="c", limit=chunk)})
        ) y
    ) x
    WHERE c.last AND c.taken < c.lim * {PICK_FACTOR}
    WINDOW w AS (PARTITION BY c.channel_id)
)
"""


FAIR_PICKS = _fair_picks(capped=False)

# The picks of a claim of one row (``only``: a batch the database refused is claimed again row by row):
# that row, by primary key, instead of a walk that would search each tenant's rows for it.
ONE_PICK = f"""
), picks(channel_id, lim, tenant_id, id, due_at, priority, turn) AS (
    SELECT t.channel_id, c.lim, t.tenant_id, t.id, t.due_at, t.priority, 1
    FROM c JOIN {_TABLE} t ON t.channel_id = c.channel_id
    WHERE t.id = %(only)s AND t.due_at IS NOT NULL AND t.due_at <= %(now)s {{filters}}
)
"""

# The claim: the picks (FAIR_PICKS or ONE_PICK in place of {picks}), locked and returned.
#
# Deadlines outside Python's datetime range ('infinity', year 12000) are clamped in SQL: a deadline
# that far ahead is no deadline, one that far back has passed. A row whose payload would take the
# claim past its payload budget comes back without it, marked over: it is left due, unleased. A row
# over the size limits, or whose payload is not an object, comes back without the value at fault and
# with its measures (row_limits), so the worker never holds it. Three levels: s0 locks the rows and
# tells which are within the budget; s measures those (OFFSET 0: computed once each); the outer
# query returns the values.
_CLAIM = f"""
WITH RECURSIVE c AS MATERIALIZED (
    SELECT * FROM unnest(%(channels)s::bigint[], %(limits)s::int[], %(leases)s::float8[])
        AS c(channel_id, lim, lease)
{{picks}}SELECT s.id, s.tenant_id, s.channel_id,
       CASE WHEN {RECIPIENT_RETURNED} THEN s.recipient END,
       CASE WHEN {PAYLOAD_RETURNED} THEN s.payload END,
       s.notification_type, s.priority, s.status, s.attempts,
       CASE WHEN s.expires_at IS NOT NULL THEN LEAST(GREATEST(s.expires_at,
           '0001-01-02 00:00+00'::timestamptz), '9999-12-30 00:00+00'::timestamptz) END,
       s.correlation_id, s.requeue_count, s.lease, s.recovered, s.crashes, NOT s.within AS over_budget,
       s.shape, s.text_size, s.recipient_chars
FROM (
SELECT s0.*, {MEASURES}
FROM (
SELECT n.*, c.lease, n.claim_token IS NOT NULL AS recovered,
       -- A recovered row's attempts that never finished (counted at claim, never logged): its crashes.
       CASE WHEN n.claim_token IS NOT NULL THEN n.attempts - (
           SELECT count(*) FROM jsonb_array_elements(n.attempt_log) e
           WHERE COALESCE((e->>'generation')::int, 0) = n.requeue_count) END AS crashes,
       sum(n.estimate) OVER w - n.estimate < %(budget)s AS within
FROM c
CROSS JOIN LATERAL (
    -- The picks in order (the LIMIT bounds nothing: it keeps them sorted apart), each picked row then
    -- read by its primary key, until the channel's limit is locked: = ANY(ARRAY[…]) can be neither
    -- hashed nor merged, so no plan reads the table to join it (the estimates of a recursive query are
    -- rough). The due condition is checked again on the row as locked (a claim beside this one may
    -- have leased it since); IS TRUE, so that no due index serves it instead of the key.
    SELECT t.*, {{estimate}} AS estimate, p.turn
    FROM (SELECT * FROM picks WHERE picks.channel_id = c.channel_id{{within_cap}}
          ORDER BY turn, due_at, priority, id LIMIT c.lim * {PICK_FACTOR} + %(tenants)s) p
    JOIN {_TABLE} t ON t.id = ANY(ARRAY[p.id])
    WHERE (t.channel_id = c.channel_id AND t.due_at <= %(now)s) IS TRUE {{filters}}
    ORDER BY p.turn, p.due_at, p.priority, p.id
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

#: The claim's statement (``{filters}`` and ``{estimate}`` to fill in), and the one of a claim of one row;
#: with per-tenant caps, the same two with the caps' fragments.
_LOCK = _CLAIM.replace("{within_cap}", "")
CLAIM_SELECT = _LOCK.replace("{picks}", FAIR_PICKS)
CLAIM_SELECT_ONE = _LOCK.replace("{picks}", ONE_PICK)
# With caps the lock step takes no row past its tenant's cap either (the picks' bound, checked again),
# and the claim of one row refuses a held tenant's.
_WITHIN_CAP = " AND picks.turn <= COALESCE(picks.cap, picks.turn)"
CLAIM_SELECT_CAPPED = _CLAIM.replace("{within_cap}", _WITHIN_CAP).replace("{picks}", _fair_picks(capped=True))
_ONE_UNHELD = f"{{filters}} AND {_cap_of('c.channel_id', 't.tenant_id')} IS DISTINCT FROM 0"
CLAIM_SELECT_ONE_CAPPED = _LOCK.replace("{picks}", _CAPS_CTE + ONE_PICK.replace("{filters}", _ONE_UNHELD))

# Ids and lease lengths travel as comma-joined text: a psycopg array parameter is quoted element by
# element in Python (a datetime costs more than its row's share of the statement).
CLAIM_UPDATE = f"""
UPDATE {_TABLE} t
SET attempts = t.attempts + 1, claim_token = %(token)s,
    claim_expires_at = %(now)s + v.lease * interval '1 second', updated_at = %(now)s,
    due_at = NULL  -- triggers.DUE_AT_RULE: leased, in no due index
FROM unnest(string_to_array(%(ids)s, ',')::uuid[], string_to_array(%(leases)s, ',')::float8[])
     AS v(id, lease)
WHERE t.id = v.id
"""


@dataclasses.dataclass(frozen=True)
class TenantCaps:
    """At most how many rows of each tenant one claim of a channel may take (``TENANT_RATE_LIMITS``).

    ``default`` caps every tenant not named in ``caps`` (None: no cap); ``caps`` names tenants (the key
    None is the null tenant) with a cap of their own; a cap of 0 takes none of that tenant's rows.
    """

    default: int | None = None
    caps: Mapping[uuid.UUID | None, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ChannelClaim:
    """How many rows of one channel to claim now, and for how long; ``tenant_caps``: per-tenant caps
    (None: none)."""

    channel_id: int
    limit: int
    lease_seconds: float
    tenant_caps: TenantCaps | None = None


@dataclasses.dataclass(frozen=True)
class Partitions:
    """The partitions a claim may take rows of: ``owned`` among ``count`` (database.locks)."""

    count: int
    owned: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    """One claim, handed from the worker's claims (engine.claiming) to the statements that run it.

    ``plan``: what to claim of each channel; ``total``: rows in all at most; ``budgets``: each channel's
    (max_attempts, key), as the claim judges a row's attempt budget; ``attempts_by_type``: budgets by
    notification type (``ATTEMPTS_BY_TYPE``); ``priorities``: only rows of these priorities (a lane's;
    None: any); ``skip``: rows set aside earlier as poison; ``max_payload_bytes``: the largest payload
    sent (None: the ``MAX_PAYLOAD_BYTES`` setting); ``partitions``: only rows of the partitions the
    worker owns (None: every row).
    """

    now: datetime
    plan: Sequence[ChannelClaim]
    total: int
    budgets: Mapping[int, tuple[int, str]]
    attempts_by_type: Mapping[str, int] = dataclasses.field(default_factory=dict)
    priorities: Sequence[int] | None = None
    skip: Collection[uuid.UUID] = ()
    max_payload_bytes: int | None = None
    partitions: Partitions | None = None


#: Payload bytes one claim reads at most (estimated from what the rows store): with the claim beside
#: it and Python's copies of each payload, a worker's memory stays a small multiple of this.
CLAIM_PAYLOAD_BYTES = 16 * 1024 * 1024


def claim_query(
    now: datetime,
    plan: Sequence[ChannelClaim],
    *,
    total: int,
    priorities: Sequence[int] | None = None,
    skip: Collection[uuid.UUID] = (),
    only: uuid.UUID | None = None,
    max_payload_bytes: int | None = None,
    partitions: Partitions | None = None,
    server_version: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """The claim's SELECT and its parameters: what :func:`claim_due` runs (and what EXPLAIN checks).

    ``max_payload_bytes`` (what a compressed payload counts as) defaults to the ``MAX_PAYLOAD_BYTES``
    setting. ``partitions``: only rows of these partitions (None: every row). ``server_version``:
    PostgreSQL's (``server_version_num``), by default as Django's connection read it. A plan with
    per-tenant caps (ChannelClaim.tenant_caps) gets the statement with caps, and their parameter.
    """
    filters = []
    # The walk over tenants counts a tenant whatever partition its rows are in, and finds one with a row
    # of the worker's partitions among about count / owned: it may visit that many times more tenants.
    tenants = TENANTS_PER_CLAIM
    if partitions is not None and partitions.count > 1:
        filters.append(f"AND {PARTITION_OF.format(row='t')} = ANY(%(partitions)s)")
        tenants = math.ceil(TENANTS_PER_CLAIM * partitions.count / max(1, len(partitions.owned)))
    if priorities:
        filters.append("AND t.priority = ANY(%(priorities)s)")
    if skip:
        filters.append("AND t.id <> ALL(%(skip)s::uuid[])")
    if only is not None:
        filters.append("AND t.id = %(only)s")
    params: dict[str, Any] = {
        "channels": [p.channel_id for p in plan],
        "limits": [p.limit for p in plan],
        "leases": [float(p.lease_seconds) for p in plan],
        "now": now,
        "total": total,
        "priorities": list(priorities or []),
        "skip": [str(i) for i in skip],
        "only": only,
        "partition_count": partitions.count if partitions is not None else 1,
        "partitions": list(partitions.owned) if partitions is not None else [],
        "budget": CLAIM_PAYLOAD_BYTES,
        "tenants": tenants,
        "start": ring_start(now),
        "max_payload": get_settings().MAX_PAYLOAD_BYTES if max_payload_bytes is None else max_payload_bytes,
    }
    if server_version is None:  # Django's PostgreSQL backend reads it once per connection wrapper
        server_version = int(getattr(connection, "pg_version", 0))
    estimate = ESTIMATE_14 if server_version >= 140000 else ESTIMATE_13
    tenant_caps = caps_parameter(plan)
    if tenant_caps is None:
        statement = CLAIM_SELECT if only is None else CLAIM_SELECT_ONE
    else:
        params["tenant_caps"] = tenant_caps
        statement = CLAIM_SELECT_CAPPED if only is None else CLAIM_SELECT_ONE_CAPPED
    return statement.format(filters=" ".join(filters), estimate=estimate), params


def caps_parameter(plan: Sequence[ChannelClaim]) -> str | None:
    """The plan's per-tenant caps as the claim reads them (``tenant_caps``, a jsonb object's text): a
    channel's default under its id, a tenant's own cap under ``<channel>/<tenant>``, the null tenant's
    under ``<channel>/``. None when no channel has a cap: the claim without caps."""
    named: dict[str, int] = {}
    for p in plan:
        if p.tenant_caps is None:
            continue
        if p.tenant_caps.default is not None:
            named[str(p.channel_id)] = max(0, p.tenant_caps.default)
        for tenant, cap in p.tenant_caps.caps.items():
            named[f"{p.channel_id}/{'' if tenant is None else tenant}"] = max(0, cap)
    return json_document(named) if named else None


def ring_start(now: datetime) -> uuid.UUID:
    """Where a claim at ``now`` starts its walk round the ring of tenant ids: drawn from the time, so
    claims start at points spread over the ring (what matters past ``TENANTS_PER_CLAIM`` tenants)."""
    return uuid.UUID(bytes=hashlib.md5(now.isoformat().encode(), usedforsecurity=False).digest())


# --------------------------------------------------------------------------------------------------
# Leases whose worker died: given back by the next claim, and claimed again in halving groups.
#
# A leased row has no ``due_at`` (``triggers.DUE_AT_RULE``): its lease's row version enters none of the due
# indexes, and ``nr_lease_expiry_idx`` finds it by its expiry. Every claim (:mod:`.claim`) first gives back
# the lapsed leases it could take itself (its channels', its partitions'), in its own transaction, so that
# its SELECT sees them due and takes them: no other worker's claim stands between the give-back and the
# take.
# --------------------------------------------------------------------------------------------------


#: Lapsed leases given back per claim at most (a claim after a crash meets at most the rows that were
#: in flight then; what is past this is given back by the next claims).
LAPSED_PER_CLAIM = 1000

# The give-back of lapsed leases, first in the claim's transaction (the claim's SELECT then sees them
# due): the expiry cleared, the token kept, so the claim reads them as recovered (their crashes
# counted, recovery_group below). Only the claim's channels and partitions: a lease another worker
# would take is left to that worker's claim, which gives it back and takes it in one transaction (the
# wake-up wakes every worker at a lease's expiry). Rows another transaction holds (a late outcome
# being written) are skipped. Due from now (DUE_AT_RULE: updated_at).
_LAPSED_IDS = f"""
    SELECT l.id FROM {_TABLE} l
    WHERE l.claim_expires_at IS NOT NULL AND l.claim_expires_at <= %(now)s
          AND l.channel_id = ANY(%(channels)s::bigint[]) AND l.id <> ALL(%(skip)s::uuid[]) {{filters}}
    ORDER BY l.claim_expires_at
    LIMIT {LAPSED_PER_CLAIM}"""
LAPSED_LEASES = f"""
UPDATE {_TABLE} t
SET claim_expires_at = NULL, updated_at = %(now)s, due_at = %(now)s
WHERE t.id IN ({_LAPSED_IDS}
    FOR UPDATE SKIP LOCKED)
"""


def lapsed_leases_query(
    now: datetime,
    channels: Sequence[int],
    *,
    skip: Collection[uuid.UUID] = (),
    partitions: Partitions | None = None,
    only: uuid.UUID | None = None,
    ids: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The give-back of the lapsed leases of ``channels`` (:data:`LAPSED_LEASES`) and its parameters:
    only rows of ``partitions`` (None: every row), none of ``skip`` (rows set aside as poison: a row the
    give-back cannot write must not fail every claim), only ``only`` if given (a give-back row by row,
    ``claim._Claim.isolate``). ``ids``: the SELECT of the rows' ids instead, unlocked."""
    params: dict[str, Any] = {
        "now": now,
        "channels": list(channels),
        "skip": [str(i) for i in skip],
        "only": only,
    }
    filters = "AND l.id = %(only)s" if only is not None else ""
    if partitions is not None and partitions.count > 1:
        filters += f" AND {PARTITION_OF.format(row='l')} = ANY(%(partitions)s)"
        params.update(partition_count=partitions.count, partitions=list(partitions.owned))
    sql = (_LAPSED_IDS if ids else LAPSED_LEASES).format(filters=filters)
    return sql, params


#: Recovered rows whose worker died once with them come back in groups of at most this many.
RECOVERY_GROUP = 16


def recovery_group(rows: list[Any], recovered_at: int, crashes_at: int) -> tuple[list[Any], bool]:
    """The rows to lease now, and whether due rows were left out on purpose (``recovered_at``,
    ``crashes_at``: the positions in a claimed row of its recovered flag and its crash count).

    A row whose lease expired was in flight when its worker died: maybe it killed the worker. Such
    rows come back in groups that halve with each death they were in flight at (16, 8, 4, 2, then
    alone), the rows of fewest deaths first: a recovery drains at the pace of a group's sends, and a
    payload that kills the process is cornered in a few rounds, each costing fewer batch-mates an
    attempt.
    """
    recovered = [row for row in rows if row[recovered_at]]
    if not recovered:
        return rows, False
    least = min(max(1, row[crashes_at] or 1) for row in recovered)
    size = max(1, RECOVERY_GROUP >> (least - 1))
    chosen = [row for row in recovered if max(1, row[crashes_at] or 1) == least][:size]
    return chosen, len(chosen) < len(rows)


__all__ = ["LAPSED_LEASES", "LAPSED_PER_CLAIM", "RECOVERY_GROUP", "lapsed_leases_query", "recovery_group"]
