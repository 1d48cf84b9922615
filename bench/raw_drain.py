"""The raw psycopg drain on the project's own table: the same SQL shape as the lean drain.

Claim (``FOR UPDATE SKIP LOCKED`` on the per-channel due index, as the worker's claim does), one
``UPDATE … FROM unnest(…)`` that marks the rows Sent and appends to the attempt history, one multi-row
outbox insert: what the schema costs
(indexes, triggers, history) without any of the worker's Python. It sets ``due_at`` itself (the trigger
that maintains it would too), so it still drains with the triggers disabled.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from bench.costs import ServerCpu
from bench.db import OUTBOX, TABLE, connect

_CLAIM = f"""
SELECT id, tenant_id, attempts, requeue_count FROM {TABLE}
WHERE channel_id = %s AND due_at IS NOT NULL AND due_at <= now()
ORDER BY due_at, priority LIMIT %s FOR UPDATE SKIP LOCKED
"""
_UPDATE = f"""
UPDATE {TABLE} t SET status = 'sent', attempts = t.attempts + 1, provider_message_id = v.pmid,
    last_error = '', error_kind = '', claim_token = NULL, claim_expires_at = NULL, due_at = NULL,
    updated_at = now(),
    attempt_log = t.attempt_log || jsonb_build_array(v.log::jsonb)
FROM unnest(%s::uuid[], %s::text[], %s::text[]) AS v(id, pmid, log) WHERE t.id = v.id
"""
_OUTBOX = f"""
INSERT INTO {OUTBOX} (event_id, topic, key, contract_version, generation, payload, created_at)
SELECT nr_outbox_event_id('pin.notifications.dispatched.v1', v.key, v.generation),
       'pin.notifications.dispatched.v1', v.key, 1, v.generation, v.payload::jsonb, now()
FROM unnest(%s::text[], %s::int[], %s::text[]) AS v(key, generation, payload)
"""


def drain(channel: int, batch: int = 200, cpu: ServerCpu | None = None) -> int:
    """Drain every due row of ``channel``, ``batch`` rows a transaction; returns rows done. ``cpu``
    adds up the server CPU the drain's backend used."""
    done = 0
    with connect() as conn, (cpu or ServerCpu()).track(conn):
        while True:
            with conn.transaction():
                rows = conn.execute(_CLAIM, (channel, batch)).fetchall()
                if not rows:
                    break
                now = datetime.now(UTC).isoformat()
                ids = [r[0] for r in rows]
                pmids = [f"raw:{r[0]}" for r in rows]
                logs = [json.dumps({"attempt": r[2] + 1, "at": now, "outcome": "sent"}) for r in rows]
                conn.execute(_UPDATE, (ids, pmids, logs))
                payloads = [
                    json.dumps(
                        {
                            "notification_id": str(r[0]),
                            "tenant_id": str(r[1]),
                            "channel": "stub",
                            "status": "Sent",
                            "attempts": r[2] + 1,
                            "provider_message_id": f"raw:{r[0]}",
                            "error": None,
                            "error_kind": None,
                            "occurred_at": now,
                            "contract_version": 1,
                        }
                    )
                    for r in rows
                ]
                conn.execute(
                    _OUTBOX,
                    ([str(r[0]) for r in rows], [r[3] for r in rows], payloads),
                )
            done += len(rows)
    return done
