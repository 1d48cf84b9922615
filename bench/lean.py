"""The lean ceiling: the least a PostgreSQL notification retry drain can write, drained by raw psycopg.

A minimal table (id, status, attempts, due_at, a lease, recipient, payload, provider_message_id) with
one partial index on ``due_at`` of the due rows, and a minimal outbox (id, key, payload, created_at).
200-row batches: ``SELECT … FOR UPDATE SKIP LOCKED``, one ``UPDATE … FROM unnest(…)``, one
``INSERT … SELECT unnest(…)``.

* inline: claim, update and outbox insert in one transaction a batch (a provider without I/O);
* leased: a first transaction leases the batch (one update, not indexed, so it can stay on the page),
  the batch is POSTed to the receiver, a second transaction writes the outcome and the outbox rows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from bench.costs import ServerCpu
from bench.db import connect

BATCH = 200

SCHEMA = """
DROP TABLE IF EXISTS lean_outbox, lean_notification;
CREATE TABLE lean_notification (
    id bigserial PRIMARY KEY,
    status text NOT NULL,
    attempts integer NOT NULL,
    due_at timestamptz,
    lease_until timestamptz,
    recipient text NOT NULL,
    payload jsonb NOT NULL,
    provider_message_id text
);
CREATE INDEX lean_due_idx ON lean_notification (due_at) WHERE status = 'failed';
CREATE TABLE lean_outbox (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""

_SEED = """
INSERT INTO lean_notification (status, attempts, due_at, recipient, payload)
SELECT 'failed', 1, now() - interval '1 hour' + g * interval '1 microsecond', 'user' || g || '@example.com',
       '{"subject": "Hello", "body": "Your order shipped"}'::jsonb
FROM generate_series(1, %s) AS g
"""

_CLAIM = """
SELECT id, attempts, recipient FROM lean_notification
WHERE status = 'failed' AND due_at <= now() AND (lease_until IS NULL OR lease_until < now())
ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED
"""
_LEASE = "UPDATE lean_notification SET lease_until = now() + interval '30 seconds' WHERE id = ANY(%s)"
_SENT = """
UPDATE lean_notification t SET status = 'sent', attempts = t.attempts + 1, due_at = NULL,
    lease_until = NULL, provider_message_id = v.pmid
FROM unnest(%s::bigint[], %s::text[]) AS v(id, pmid) WHERE t.id = v.id
"""
_OUTBOX = """
INSERT INTO lean_outbox (key, payload)
SELECT v.key, v.payload::jsonb FROM unnest(%s::text[], %s::text[]) AS v(key, payload)
"""


def create(rows: int) -> None:
    """(Re)create the lean tables with ``rows`` due rows, vacuumed and analyzed."""
    with connect(autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(_SEED, (rows,))
        conn.execute("VACUUM ANALYZE lean_notification")
        conn.execute("VACUUM ANALYZE lean_outbox")


def _events(rows: list[tuple[Any, ...]], pmids: list[str]) -> tuple[list[str], list[str]]:
    now = datetime.now(UTC).isoformat()
    keys = [str(r[0]) for r in rows]
    payloads = [
        json.dumps({"id": r[0], "status": "Sent", "attempts": r[1] + 1, "provider_message_id": p, "at": now})
        for r, p in zip(rows, pmids, strict=True)
    ]
    return keys, payloads


def drain_inline(cpu: ServerCpu | None = None) -> int:
    """Claim, mark Sent and write the outbox in one transaction per batch; returns rows done.
    ``cpu`` adds up the server CPU the drain's backend used."""
    done = 0
    with connect() as conn, (cpu or ServerCpu()).track(conn):
        while True:
            with conn.transaction():
                rows = conn.execute(_CLAIM, (BATCH,)).fetchall()
                if not rows:
                    break
                ids = [r[0] for r in rows]
                pmids = [f"lean:{i}" for i in ids]
                conn.execute(_SENT, (ids, pmids))
                conn.execute(_OUTBOX, _events(rows, pmids))
            done += len(rows)
    return done


def drain_leased(send: Callable[[tuple[Any, ...]], str], concurrency: int) -> int:
    """Lease a batch, send it (``concurrency`` calls at a time), then commit outcomes and events."""
    done = 0
    with connect() as conn, ThreadPoolExecutor(concurrency) as pool:
        while True:
            with conn.transaction():
                rows = conn.execute(_CLAIM, (BATCH,)).fetchall()
                if rows:
                    conn.execute(_LEASE, ([r[0] for r in rows],))
            if not rows:
                break
            pmids = list(pool.map(send, rows))
            with conn.transaction():
                conn.execute(_SENT, ([r[0] for r in rows], pmids))
                conn.execute(_OUTBOX, _events(rows, pmids))
            done += len(rows)
    return done


def http_sender(url: str, concurrency: int) -> tuple[Callable[[tuple[Any, ...]], str], Callable[[], None]]:
    """A ``send`` for :func:`drain_leased` POSTing to ``url`` over kept-alive connections, and its closer."""
    import httpx

    client = httpx.Client(
        timeout=10,
        trust_env=False,
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )

    def send(row: tuple[Any, ...]) -> str:
        body = {"id": row[0], "recipient": row[2]}
        answer = client.post(url, json=body, headers={"Idempotency-Key": f"lean-{row[0]}"})
        answer.raise_for_status()
        return str(answer.json().get("id", ""))

    return send, client.close
