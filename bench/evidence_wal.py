"""``python -m bench.evidence_wal``: WAL bytes per failed attempt, before and after evidence per attempt.

Each failed attempt appends an entry to the row's ``attempt_log`` in the finalize UPDATE. Since the
evidence fields (``status_code``, ``response_excerpt``, ``remote_addr``, ``trigger``) an entry is larger,
and the whole row version (``attempt_log`` with it, or its TOAST chunks once it is large) goes to the
WAL at every attempt. This measures it on a throwaway cluster (``--server url``: the server of
``DATABASE_URL``), on ``--rows`` due rows per variant, over ``--attempts`` failed attempts in a row:

* ``before``: the finalize statement as it was before the evidence fields (kept here as the reference),
  writing the entry it wrote;
* ``after, no answer``: the product's ``apply_outcomes`` for a timeout (status null, no excerpt);
* ``after, 500 + short body``: ``Internal Server Error`` (21 bytes) as the excerpt;
* ``after, 500 + 1 KiB body``: an excerpt at its cap (1,024 bytes of an HTML error page).

Every attempt round is one transaction per variant after a ``CHECKPOINT`` (so each variant pays its
own full-page images): WAL bytes = ``pg_wal_lsn_diff`` around it, divided by the rows.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench.cluster import PrivateCluster
from bench.db import TABLE, add_rows, channel, connect, conninfo, recreate_database, setup_django

#: The finalize UPDATE before evidence per attempt (its entry had no answer fields and no trigger).
BEFORE = f"""
UPDATE {TABLE} t
SET status = v.status, attempts = v.attempts, next_attempt_at = v.next_attempt_at,
    provider_message_id = COALESCE(v.provider_message_id, t.provider_message_id),
    last_error = v.last_error, error_kind = v.error_kind, dead_lettered_at = v.dead_lettered_at,
    dead_letter_reason = v.dead_letter_reason, claim_token = NULL, claim_expires_at = NULL,
    due_at = CASE WHEN v.status = 'failed' AND v.dead_lettered_at IS NULL
                      THEN COALESCE(v.next_attempt_at, t.created_at)
                  WHEN v.status = 'pending' THEN t.scheduled_at END,
    updated_at = %(now)s,
    attempt_log = t.attempt_log || jsonb_build_array(v.log_entry)
FROM jsonb_to_recordset(%(rows)s::jsonb)
     AS v(id uuid, token uuid, status text, attempts int, next_attempt_at timestamptz,
          provider_message_id text, last_error text, error_kind text, dead_lettered_at timestamptz,
          dead_letter_reason text, log_entry jsonb)
WHERE t.id = v.id
"""

ERROR = "webhook answered HTTP 500"
# The worst case for the cap: 1,024 bytes that do not compress (TOAST's pglz would shrink a real,
# repetitive error page), made from a seeded generator so runs compare.
PAGE = base64.b64encode(random.Random(27).randbytes(768)).decode()
VARIANTS = ("before", "after, no answer", "after, 500 + short body", "after, 500 + 1 KiB body")


def _evidence(variant: str) -> Any:
    from notifications_retry.rules.outcomes import NO_ANSWER, Evidence

    if variant == "after, no answer":
        return NO_ANSWER
    body = "Internal Server Error" if "short" in variant else PAGE
    return Evidence(500, body, "203.0.113.7")


def _ids(cid: int) -> list[str]:
    with connect() as conn:
        return [str(r[0]) for r in conn.execute(f"SELECT id FROM {TABLE} WHERE channel_id = %s", [cid])]


def _wal(run: Any) -> int:
    with connect(autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        start = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
        run()
        end = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
        return int(conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", [end, start]).fetchone()[0])  # type: ignore[index]


def _before(ids: list[str], attempt: int, now: datetime) -> None:
    rows = [
        {
            "id": i,
            "token": None,
            "status": "failed",
            "attempts": attempt,
            "next_attempt_at": (now + timedelta(minutes=5)).isoformat(),
            "provider_message_id": None,
            "last_error": ERROR,
            "error_kind": "http_5xx",
            "dead_lettered_at": None,
            "dead_letter_reason": "",
            "log_entry": {
                "attempt": attempt,
                "at": now.isoformat(),
                "outcome": "retry",
                "generation": 0,
                "duration_ms": 84.2,
                "error_kind": "http_5xx",
                "error": ERROR,
            },
        }
        for i in ids
    ]
    with connect() as conn:
        conn.execute(BEFORE, {"rows": json.dumps(rows), "now": now})


def _after(ids: list[str], cid: int, attempt: int, now: datetime, variant: str) -> None:
    from django.db import transaction

    from notifications_retry.delivery.finalize import apply_outcomes
    from notifications_retry.rules.outcomes import RETRY, ClaimedRecord, Outcome

    evidence = _evidence(variant)
    outcomes = [
        Outcome(
            ClaimedRecord(uuid.UUID(i), None, cid, "r", {}, "", 5, "failed", attempt, None, "", 0, None),
            RETRY,
            error_kind="http_5xx",
            error=ERROR,
            next_attempt_at=now + timedelta(minutes=5),
            duration_ms=84.2,
            retriable=True,
            evidence=evidence,
        )
        for i in ids
    ]
    with transaction.atomic():
        apply_outcomes(outcomes, now, guarded=False)


def _round(
    variant: str, ids: dict[str, list[str]], channels: dict[str, int], attempt: int, now: datetime
) -> None:
    if variant == "before":
        _before(ids[variant], attempt, now)
    else:
        _after(ids[variant], channels[variant], attempt, now, variant)


def measure(rows: int, attempts: int, *, own_cluster: bool) -> None:
    """On a cluster of its own, both with and without full-page writes; on a shared server, as it is
    (``full_page_writes`` is a server-wide setting: the benchmark never changes another's server)."""
    if not own_cluster:
        _measure(rows, attempts)
        return
    for full_pages in (False, True):
        with psycopg.connect(conninfo(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET full_page_writes = {'on' if full_pages else 'off'}")
            conn.execute("SELECT pg_reload_conf()")
        print(
            "\n## With full-page images (full_page_writes on, a CHECKPOINT before each round)\n"
            if full_pages
            else "\n## WAL records alone (full_page_writes off)\n"
        )
        _measure(rows, attempts)


def _measure(rows: int, attempts: int) -> None:
    setup_django()
    from django.db import connections

    connections.close_all()  # the database is dropped and made anew: no connection may outlive it
    recreate_database()
    channels = {
        v: channel(f"wal-{n}", "webhook", options={"url": "https://hooks.example.com/x"})
        for n, v in enumerate(VARIANTS)
    }
    for n, cid in enumerate(channels.values()):
        add_rows([cid], rows, start=1 + n * rows)
    ids = {v: _ids(cid) for v, cid in channels.items()}
    now = datetime(2030, 1, 1, tzinfo=UTC)
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for attempt in range(1, attempts + 1):
        now += timedelta(minutes=5)
        for variant in VARIANTS:
            results[variant].append(
                _wal(functools.partial(_round, variant, ids, channels, attempt, now)) / rows
            )
    print(f"WAL bytes per failed attempt ({rows:,} rows per variant, one transaction per attempt round)\n")
    print(
        "| variant | " + " | ".join(f"attempt {a}" for a in range(1, attempts + 1)) + " | mean | vs before |"
    )
    print("|---|" + "---:|" * (attempts + 2))
    base = sum(results["before"]) / attempts
    for variant in VARIANTS:
        mean = sum(results[variant]) / attempts
        cells = " | ".join(f"{b:,.0f}" for b in results[variant])
        print(
            f"| {variant} | {cells} | {mean:,.0f} | {mean - base:+,.0f} B ({mean / base:.2f}x) |", flush=True
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--attempts", type=int, default=5)
    parser.add_argument("--server", choices=["private", "url"], default="private")
    args = parser.parse_args(argv)
    if args.server == "url":
        measure(args.rows, args.attempts, own_cluster=False)
        return
    cluster = PrivateCluster().start()
    os.environ["DATABASE_URL"] = cluster.url
    try:
        measure(args.rows, args.attempts, own_cluster=True)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
