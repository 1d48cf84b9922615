"""Queries the fault tests assert with: lock owners, claims, outbox events per record."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from django.db import connection

from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from tests.support.http_server import RecordedRequest

#: Backends holding the default lane's tick lock (LOCK_KEY's default), one row each. Only that lock: a
#: worker also holds the relay's key locks and, when elected, housekeeping's, on the same session.
ADVISORY_HOLDERS = """
SELECT DISTINCT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = %s)
  AND ((classid::bigint << 32) | objid::bigint) = hashtextextended('notifications:retry-worker', 0)
"""


def lock_holders(dbname: str | None = None) -> list[int]:
    """Backend pids holding the default lane's tick lock in the test database now."""
    with connection.cursor() as cursor:
        cursor.execute(ADVISORY_HOLDERS, [dbname or connection.settings_dict["NAME"]])
        return [row[0] for row in cursor.fetchall()]


def claimed_ids() -> set[Any]:
    """Records leased and not finalized (in flight, or left behind by a dead worker)."""
    return set(NotificationEntity.objects.filter(claim_token__isnull=False).values_list("pk", flat=True))


def db_now() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def webhook_channel(url: str, **fields: Any) -> ChannelConfig:
    """A webhook channel at ``url`` with small, test-friendly timings."""
    defaults: dict[str, Any] = dict(
        key="hook",
        provider_key="webhook",
        max_attempts=5,
        timeout_seconds=1.0,
        max_concurrency=8,
        backoff_base_seconds=1,
        backoff_cap_seconds=60,
    )
    defaults.update(fields)
    options = {"url": url, **defaults.pop("options", {})}
    return ChannelConfig.objects.create(options=options, **defaults)


def requests_by_key(requests: list[RecordedRequest]) -> dict[str, list[RecordedRequest]]:
    grouped: dict[str, list[RecordedRequest]] = defaultdict(list)
    for request in requests:
        grouped[request.headers.get("idempotency-key", "")].append(request)
    return grouped


def assert_one_event_per_final_outcome() -> None:
    """Every Sent or dead-lettered record has exactly one outbox event, matching its status; others none."""
    events = Counter(Outbox.objects.values_list("key", flat=True))
    assert all(count == 1 for count in events.values()), [k for k, c in events.items() if c > 1][:5]
    statuses = dict(Outbox.objects.values_list("key", "payload__status"))
    for pk, status, dead in NotificationEntity.objects.values_list("pk", "status", "dead_lettered_at"):
        key = str(pk)
        if status == NotificationEntity.Status.SENT:
            assert statuses.get(key) == "Sent", (key, statuses.get(key))
        elif dead is not None:
            assert statuses.get(key) == "Failed", (key, statuses.get(key))
        else:
            assert key not in statuses, key
