"""Memory does not follow the hostile side: a provider answering 200 MB of headers to every call at
max_concurrency 32, and payloads at MAX_PAYLOAD_BYTES, keep the worker's peak RSS under the bound
docs/operations.md states (256 MB) next to the container limit it recommends."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from notifications_retry.models import ChannelConfig, NotificationEntity
from tests.process.conftest import seed_due
from tests.process.helpers import webhook_channel
from tests.support.raw_http_server import RawServer, endless

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MB = 1024 * 1024
RSS_BOUND_MB = 256
# The circuit stays closed, so every one of the 320 calls meets the flood (32 at a time).
SETTINGS = {
    "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    "LEASE_GRACE_SECONDS": 0.5,
    "CIRCUIT_BREAKER": {"failure_threshold": 10000},
}


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def watch_peak(pid: int, stop: threading.Event, seen: list[float]) -> None:
    while not stop.is_set():
        try:
            seen.append(peak_rss_mb(pid))
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return
        time.sleep(0.05)


def test_peak_rss_stays_bounded_under_header_floods_and_payloads_at_the_limit(start_worker):
    flood = endless(b"HTTP/1.1 200 OK\r\nX-Big: ", b"a" * 65536, 200 * MB)
    with RawServer(flood) as server:
        hook = webhook_channel(server.url, max_concurrency=32, timeout_seconds=2.0, max_attempts=5)
        seed_due(hook, 320)
        bulky = ChannelConfig.objects.create(key="bulky", provider_key="in_app", max_attempts=5)
        seed_due(bulky, 400)
        # Payloads at the size limit (256 KiB), written as other code would.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE notifications_retry_notificationentity SET payload = jsonb_build_object("
                "'subject', 'Hello', 'body', repeat('x', 256 * 1024 - 64)) WHERE channel_id = %s",
                [bulky.pk],
            )
        worker = start_worker(["--once", "--batch-size", "720", "--max-duration", "60"], SETTINGS)
        stop, seen = threading.Event(), []
        watcher = threading.Thread(target=watch_peak, args=(worker.pid, stop, seen), daemon=True)
        watcher.start()
        status = worker.wait(120)
        stop.set()
        watcher.join(2)
    assert status == 0, worker.output()[-3000:]
    # The rows' states, not the tick's counters (a call that outlives its lease on a loaded machine is
    # taken again within the tick and counted twice). How many calls fit in the tick depends on the
    # machine too (queued records whose lease can no longer cover a call go back unsent): at least one
    # round of 32 met the flood, none was taken for sent, none is left leased, and the bulky rows went.
    hook_rows = NotificationEntity.objects.filter(channel=hook)
    assert hook_rows.filter(attempts__gte=2).count() >= 32
    assert not hook_rows.exclude(status=NotificationEntity.Status.FAILED).exists()
    assert not hook_rows.filter(claim_token__isnull=False).exists()
    assert (
        NotificationEntity.objects.filter(channel=bulky, status=NotificationEntity.Status.SENT).count() == 400
    )
    assert server.connections >= 32
    peak = max(seen)
    print(f"worker peak RSS: {peak:.0f} MB (bound {RSS_BOUND_MB} MB)")
    assert peak < RSS_BOUND_MB, peak


#: Rows written past the API (raw SQL), as a bad migration or a restore would leave them.
POISON_SET = [
    ("payload = jsonb_build_object('body', repeat('x', 50 * 1024 * 1024))", 1),
    ("payload = jsonb_build_object('body', repeat(md5(random()::text), 5 * 1024 * 1024 / 32))", 20),
    ("recipient = repeat('r', 10 * 1024 * 1024)", 1),
    ("payload = jsonb_build_array(repeat('y', 1024 * 1024))", 1),
    ("payload = to_jsonb(repeat('z', 1024 * 1024))", 1),
]


def test_peak_rss_stays_bounded_with_the_poison_set_present(start_worker):
    """Oversized and non-object rows are set aside at claim without the worker reading them."""
    healthy = ChannelConfig.objects.create(key="in_app", provider_key="in_app", max_attempts=5)
    seed_due(healthy, 200)
    poison = ChannelConfig.objects.create(key="poison", provider_key="in_app", max_attempts=5)
    with connection.cursor() as cursor:
        for assignment, count in POISON_SET:
            seed_due(poison, count)
            cursor.execute(
                f"UPDATE notifications_retry_notificationentity SET {assignment} WHERE id IN ("
                "SELECT id FROM notifications_retry_notificationentity WHERE channel_id = %s "
                "AND dead_lettered_at IS NULL AND status = 'failed' AND recipient NOT LIKE 'rrrr%%' "
                "AND jsonb_typeof(payload) = 'object' AND pg_column_size(payload) < 1000 LIMIT %s)",
                [poison.pk, count],
            )
    worker = start_worker(["--once", "--batch-size", "500", "--max-duration", "60"], SETTINGS)
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=watch_peak, args=(worker.pid, stop, seen), daemon=True)
    watcher.start()
    status = worker.wait(120)
    stop.set()
    watcher.join(2)
    peak = max(seen)
    print(f"worker peak RSS with the poison set: {peak:.0f} MB (bound {RSS_BOUND_MB} MB)")
    assert status == 0, worker.output()[-3000:]
    assert NotificationEntity.objects.filter(channel=healthy, status="sent").count() == 200
    kinds = NotificationEntity.objects.filter(channel=poison).values_list("error_kind", flat=True)
    assert sorted(kinds) == sorted(["payload_too_large"] * 22 + ["payload_invalid"] * 2)
    assert peak < RSS_BOUND_MB, peak
