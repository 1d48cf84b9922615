"""The benchmark database: connections, Django setup, channels and seeded due rows.

Every part of the benchmark works on a dedicated database (``nr_bench`` unless
``NR_BENCH_DATABASE_NAME`` says otherwise) on the server of ``DATABASE_URL``, dropped and recreated
at the start of a run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
TABLE = "notifications_retry_notificationentity"
OUTBOX = "notifications_retry_outbox"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def conninfo(dbname: str | None = None) -> str:
    """The connection string of ``DATABASE_URL``, pointed at ``dbname`` when given."""
    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    return pg_conninfo.make_conninfo(url, dbname=dbname) if dbname else url


def bench_dbname() -> str:
    """The benchmark database's name (never the server's default database)."""
    return os.environ.get("NR_BENCH_DATABASE_NAME", "nr_bench")


def connect(autocommit: bool = False) -> psycopg.Connection[Any]:
    """A new connection to the benchmark database."""
    return psycopg.connect(conninfo(bench_dbname()), autocommit=autocommit)


def recreate_database() -> None:
    """Drop and create the benchmark database, then migrate it."""
    name = bench_dbname()
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    with connect(autocommit=True) as conn:
        # Frequent autovacuum on the hot table, as docs/performance.md recommends.
        conn.execute(
            f"ALTER TABLE {TABLE} SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_analyze_scale_factor = 0.01)"
        )


_django_ready = False


def setup_django() -> None:
    """Configure Django with bench.settings (idempotent)."""
    global _django_ready
    if _django_ready:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ["NR_BENCH_DATABASE_NAME"] = bench_dbname()
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import django

    django.setup()
    _django_ready = True


_INSERT = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(),
       -- tenants 0: every row a tenant of its own; else that many, spread evenly over the due rows.
       CASE WHEN %(tenants)s::int = 0 THEN gen_random_uuid()
            ELSE md5(((g / %(every)s::int) %% %(tenants)s::int)::text)::uuid END,
       (%(channels)s::bigint[])[1 + g %% %(nchannels)s::int],
       'user' || g || '@example.com', '{{"subject": "Hello", "body": "Your order shipped"}}'::jsonb, '',
       (ARRAY[0, 5, 9])[1 + g %% 3],
       CASE WHEN g %% %(every)s::int = 0 THEN 'failed' ELSE 'sent' END, 1,
       CASE WHEN g %% %(every)s::int = 0 THEN now() - interval '1 hour' + g * interval '1 microsecond' END,
       CASE WHEN g %% %(every)s::int = 0 THEN NULL ELSE 'old-' || g END,
       CASE WHEN g %% %(every)s::int = 0 THEN 'HTTP 503' ELSE '' END,
       CASE WHEN g %% %(every)s::int = 0 THEN 'http_5xx' ELSE '' END,
       '[]'::jsonb, '', '', 0, '', now() - interval '2 hours', now() - interval '2 hours'
FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS g
"""


def channel(key: str, provider_key: str = "stub", **fields: Any) -> int:
    """Create or update a channel; returns its id."""
    from notifications_retry.models import ChannelConfig

    defaults = {
        "provider_key": provider_key,
        "is_enabled": True,
        "max_attempts": 5,
        "timeout_seconds": 5.0,
        "backoff_base_seconds": 60,
        "backoff_cap_seconds": 3600,
        "options": {},
        "max_concurrency": 10,
        "rate_limit_per_second": None,
        **fields,
    }
    obj, _ = ChannelConfig.objects.update_or_create(key=key, defaults=defaults)
    return int(obj.pk)


def reset_rows() -> None:
    """Empty the notification and outbox tables (TRUNCATE fires no row triggers)."""
    with connect(autocommit=True) as conn:
        # CASCADE: the tables that reference notifications (delivery statuses, ...) are emptied with them.
        conn.execute(f"TRUNCATE {OUTBOX}, notifications_retry_deadletteraction, {TABLE} CASCADE")


def add_rows(
    channels: Sequence[int],
    total: int,
    *,
    due_every: int = 1,
    start: int = 1,
    chunk: int = 500_000,
    tenants: int = 0,
) -> None:
    """Insert ``total`` rows spread over ``channels``; every ``due_every``-th is a due Failed row.

    ``tenants``: how many tenants the due rows are spread over, evenly (0: each row a tenant of its own).
    """
    with connect(autocommit=True) as conn:
        lo = start
        while lo < start + total:
            hi = min(start + total - 1, lo + chunk - 1)
            conn.execute(
                _INSERT,
                {
                    "channels": list(channels),
                    "nchannels": len(channels),
                    "every": due_every,
                    "tenants": tenants,
                    "start": lo,
                    "stop": hi,
                },
            )
            lo = hi + 1
        conn.execute(f"VACUUM ANALYZE {TABLE}")
        conn.execute(f"VACUUM ANALYZE {OUTBOX}")


def count_sent() -> int:
    """Rows in Sent status (seeded Sent rows included)."""
    with connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'sent'").fetchone()
        return int(row[0]) if row else 0


def count_outbox() -> int:
    with connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM {OUTBOX}").fetchone()
        return int(row[0]) if row else 0
