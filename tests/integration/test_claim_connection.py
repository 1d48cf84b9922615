"""Claims of asynchronous channels are awaited on the send loop, on an asynchronous connection of their
own: the calls in flight go on while the server claims, the claim writes what the synchronous one
writes, and a claim that fails there is redone on Django's connection."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from structlog.testing import capture_logs

from notifications_retry.delivery import ChannelClaim, ClaimRequest
from notifications_retry.engine import claiming as claim_connection_module
from notifications_retry.engine import dispatcher
from notifications_retry.engine.claiming import ClaimConnection
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from notifications_retry.runtime.asyncio_bridge import SteppedLoop
from tests.factories import ChannelFactory, NotificationFactory, due_notifications
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db(transaction=True)

Status = NotificationEntity.Status


def webhook_rows(clock: Any, url: str, count: int) -> list[NotificationEntity]:
    channel = ChannelFactory(key="hook", provider_key="webhook", options={"url": url}, max_concurrency=4)
    return due_notifications(clock, channel, count)


def claim_ten(claims: ClaimConnection, channel: Any, clock: Any) -> Any:
    request = ClaimRequest(
        clock.now(),
        [ChannelClaim(channel.pk, 10, 60.0)],
        total=10,
        budgets={channel.pk: (5, "hook")},
        max_payload_bytes=1_000_000,
    )
    return claims.loop.run(claims.claim(request, connect=True, settle=None))


def test_the_send_loop_runs_while_the_claim_waits_for_the_server(clock):
    channel = ChannelFactory(key="hook", provider_key="webhook", options={"url": "http://127.0.0.1:9/"})
    due_notifications(clock, channel, 3)
    loop = SteppedLoop()
    ticks = [0]

    async def call_in_flight() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0)

    loop.spawn([call_in_flight()])
    claims = ClaimConnection(loop)
    try:
        batch = claim_ten(claims, channel, clock)
        assert claims.open
    finally:
        claims.close()
        loop.close()
    assert len(batch.records) == 3
    assert ticks[0] > 0, "the task in flight ran while the claim's statements were awaited"
    leased = NotificationEntity.objects.filter(claim_token__isnull=False)
    assert {r.pk for r in leased} == {r.id for r in batch.records}
    assert {r.attempts for r in leased} == {2}, "the attempt is counted at the claim"


def test_the_asynchronous_claim_settles_what_the_synchronous_one_settles(clock):
    channel = ChannelFactory(key="hook", provider_key="webhook", options={"url": "http://127.0.0.1:9/"})
    spent = NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=5, next_attempt_at=clock.now()
    )
    expired = NotificationFactory(
        channel=channel,
        status=Status.FAILED,
        attempts=1,
        next_attempt_at=clock.now() - timedelta(seconds=1),
        expires_at=clock.now() - timedelta(seconds=1),
    )
    fine = due_notifications(clock, channel, 1)[0]
    loop = SteppedLoop()
    claims = ClaimConnection(loop)
    try:
        batch = claim_ten(claims, channel, clock)
    finally:
        claims.close()
        loop.close()
    assert [r.id for r in batch.records] == [fine.pk]
    assert {o.record.id: o.error_kind for o in batch.settled} == {
        spent.pk: "attempts_exhausted",
        expired.pk: "expired",
    }
    for row in (spent, expired):
        row.refresh_from_db()
        assert row.status == Status.FAILED and row.dead_lettered_at is not None and row.claim_token is None
    # The outcome's event is written with it, in the claim's transaction.
    assert set(Outbox.objects.values_list("key", flat=True)) == {str(spent.pk), str(expired.pk)}


def test_a_webhook_drain_claims_on_the_claim_connection_of_the_workers_own_thread(
    webhook_server, clock, monkeypatch
):
    monkeypatch.setattr(dispatcher, "CLAIM_CHUNK_SIZE", 4)
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    created = webhook_rows(clock, webhook_server.url, 12)
    seen: list[tuple[str, int]] = []
    claimed: list[int] = []
    real = claim_connection_module.claim_due_async

    async def recording(conn: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((threading.current_thread().name, conn.info.backend_pid))
        batch = await real(conn, *args, **kwargs)
        claimed.append(len(batch.records))
        return batch

    monkeypatch.setattr(claim_connection_module, "claim_due_async", recording)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    stats = worker.run(once=True)[0]
    assert stats.sent == 12
    assert sum(claimed) == 12 and len(claimed) >= 2, "every row claimed on the claim connection, in chunks"
    assert {name for name, _ in seen} == {threading.current_thread().name}, "on the worker's thread"
    connection.ensure_connection()
    assert connection.connection.info.backend_pid not in {pid for _, pid in seen}
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}
    assert sorted(Outbox.objects.values_list("key", flat=True)) == sorted(str(r.pk) for r in created)


def test_a_claim_that_fails_on_the_claim_connection_is_redone_on_djangos(webhook_server, clock, monkeypatch):
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    created = webhook_rows(clock, webhook_server.url, 5)
    real_params = ClaimConnection._params

    def wrong_database(self: ClaimConnection) -> dict[str, Any]:
        return {**real_params(self), "dbname": "nr_no_such_database"}

    monkeypatch.setattr(ClaimConnection, "_params", wrong_database)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    with capture_logs() as logs:
        stats = worker.run(once=True)[0]
    assert stats.sent == 5 and not stats.error
    fallbacks = [e for e in logs if e["event"] == "claim-fallback"]
    assert fallbacks and fallbacks[0]["fallback"] == "django-connection"
    assert "nr_no_such_database" in fallbacks[0]["error"]
    ids = [r.pk for r in created]
    statuses = NotificationEntity.objects.filter(pk__in=ids).values_list("status", flat=True)
    assert set(statuses) == {Status.SENT}


def test_a_kept_connection_the_server_closed_is_replaced_within_the_same_claim(clock):
    channel = ChannelFactory(key="hook", provider_key="webhook", options={"url": "http://127.0.0.1:9/"})
    loop = SteppedLoop()
    claims = ClaimConnection(loop)
    try:
        claim_ten(claims, channel, clock)  # nothing due yet: the connection is opened and kept
        first = claims._conn.info.backend_pid
        with connection.cursor() as cursor:  # the server ends it (a restart, an idle timeout)
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
        due_notifications(clock, channel, 2)
        batch = claim_ten(claims, channel, clock)
        assert len(batch.records) == 2
        assert claims.open and claims._conn.info.backend_pid != first
    finally:
        claims.close()
        loop.close()


def test_lapsed_leases_come_back_on_the_claim_connection_and_one_it_cannot_write_is_set_aside(
    webhook_server, clock
):
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    created = webhook_rows(clock, webhook_server.url, 4)
    lapsed, poison = created[0], created[1]
    # A worker died holding the first row: its lease ran out. The second is Sent with a lease that ran
    # out (what an INSERT by other code can leave): the give-back cannot write it.
    expired = clock.now() - timedelta(seconds=30)
    NotificationEntity.objects.filter(pk=lapsed.pk).update(
        claim_token="00000000-0000-4000-8000-000000000001", claim_expires_at=expired, attempts=2
    )
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE notifications_retry_notificationentity DISABLE TRIGGER USER")
        try:
            cursor.execute(
                "UPDATE notifications_retry_notificationentity SET status = 'sent', "
                "provider_message_id = 'x', claim_token = gen_random_uuid(), claim_expires_at = %s, "
                "due_at = NULL WHERE id = %s",
                [expired, poison.pk],
            )
        finally:
            cursor.execute("ALTER TABLE notifications_retry_notificationentity ENABLE TRIGGER USER")
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    with capture_logs() as logs:
        stats = worker.run(once=True)[0]
    assert stats.poisoned == 1 and not stats.error
    assert [e["fallback"] for e in logs if e["event"] == "claim-fallback"][:2] == [
        "django-connection",
        "row-by-row",
    ]
    healthy = [r.pk for r in created if r.pk != poison.pk]
    assert set(NotificationEntity.objects.filter(pk__in=healthy).values_list("status", flat=True)) == {
        Status.SENT
    }
    lapsed.refresh_from_db()
    assert lapsed.attempts == 3, "the lapsed attempt stays counted, and the new one"
