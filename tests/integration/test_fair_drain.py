"""Fairness with a real worker: while tenant A's 20,000 due rows drain to a real receiver on 127.0.0.1,
tenant B's rows that fall due are taken from the first claim after that on, alternating with A's, and
sent: a backlog delays another tenant's rows by about one claim, not by the backlog."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection

from notifications_retry.engine import claiming, ports
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

Status = NotificationEntity.Status
TABLE = NotificationEntity._meta.db_table
A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)
A_ROWS, B_ROWS = 20_000, 20

_FILL_A = f"""
INSERT INTO {TABLE} (id, tenant_id, channel_id, recipient, payload, notification_type, priority, status,
    attempts, next_attempt_at, provider_message_id, last_error, error_kind, attempt_log, dead_letter_reason,
    resolution, requeue_count, correlation_id, created_at, updated_at)
SELECT gen_random_uuid(), %(tenant)s, %(channel)s, 'a' || g, '{{}}'::jsonb, '', 5, 'failed', 1,
       %(now)s::timestamptz - interval '1 hour' + g * interval '1 millisecond', NULL, '', '', '[]'::jsonb,
       '', '', 0, '', %(now)s::timestamptz - interval '1 day', %(now)s::timestamptz - interval '1 day'
FROM generate_series(1, %(rows)s) AS g
"""


@pytest.mark.django_db(transaction=True)
def test_a_small_tenants_rows_are_claimed_within_a_claim_of_falling_due_while_a_backlog_drains(
    webhook_server, clock, monkeypatch
):
    webhook_server.responder = lambda request: Reply(200, {"id": "m"})
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": webhook_server.url}, max_concurrency=50
    )
    with connection.cursor() as cursor:
        cursor.execute(_FILL_A, {"tenant": A, "channel": channel.pk, "now": clock.now(), "rows": A_ROWS})
    # B's rows are scheduled a second ahead: they fall due while A's backlog drains.
    b_due = clock.now() + timedelta(seconds=1)
    rows_b = NotificationEntity.objects.bulk_create(
        NotificationFactory.build(channel=channel, tenant_id=B, status=Status.PENDING, scheduled_at=b_due)
        for _ in range(B_ROWS)
    )
    worker = Worker(batch_size=A_ROWS + B_ROWS, max_duration=60, clock=clock)
    claims: list[tuple[object, list]] = []
    real_claim, real_async_claim = ports.claim_due, claiming.claim_due_async

    def note(now, batch):
        # The real claim, recorded: when it ran and what it leased. After the third, B's rows fall due
        # (the worker's clock moves past their time); after the sixth the worker is asked to stop.
        claims.append((now, batch.records))
        if len(claims) == 3:
            clock.set(b_due)
        if len(claims) == 6:
            worker.stop()
        return batch

    def watched(request, **kwargs):
        return note(request.now, real_claim(request, **kwargs))

    async def watched_async(conn, request, **kwargs):
        # The webhook channel's claims run on the worker's asynchronous claim connection.
        return note(request.now, await real_async_claim(conn, request, **kwargs))

    monkeypatch.setattr(ports, "claim_due", watched)
    monkeypatch.setattr(claiming, "claim_due_async", watched_async)
    try:
        worker.run(once=True)
    finally:
        worker.close()
    first_after = next(i for i, (now, _) in enumerate(claims) if now >= b_due)
    sizes = [len(records) for _, records in claims]
    assert not any(r.tenant_id == B for _, records in claims[:first_after] for r in records)
    # From the first claim after B's rows fell due, the claims alternate A's rows and B's: B takes
    # half of that claim (A's oldest row comes first), and the rest of its rows in the next one.
    first = claims[first_after][1]
    assert sum(r.tenant_id == B for r in first) == min(B_ROWS, len(first) // 2), sizes
    after_due = [r for _, records in claims[first_after : first_after + 2] for r in records]
    last_b = max(i for i, r in enumerate(after_due) if r.tenant_id == B)
    assert {r.id for r in after_due if r.tenant_id == B} == {r.pk for r in rows_b}, sizes
    # So no more of A's rows got ahead of B's last row than B has rows (one per round, and one more
    # where the claims meet), however many A has: fewer than one claim's worth.
    assert last_b + 1 <= 2 * B_ROWS + 2, (last_b, sizes)
    # A's backlog was nearly whole then: B did not wait for it.
    a_before = sum(len(records) for _, records in claims[:first_after])
    assert A_ROWS - a_before > 19_000, sizes
    # And B's rows reached the receiver, every one of them.
    sent_b = NotificationEntity.objects.filter(tenant_id=B, status=Status.SENT).count()
    received = {request.json()["notification_id"] for request in webhook_server.requests}
    assert sent_b == B_ROWS and {str(r.pk) for r in rows_b} <= received
