"""A commit on Django's connection writes its outbox events by COPY, the send loop's commit by INSERT
(delivery.finalize, statements.CopyIn): the same events, their ids derived the same way."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from django.db import connection

from notifications_retry.delivery import SENT, TERMINAL, Outcome, finalize
from notifications_retry.delivery.finalize import FinalizeReport, finalize_async
from notifications_retry.models import Outbox
from notifications_retry.rules.event_ids import outbox_event_id
from tests.support.claims import claimed_in_app

pytestmark = pytest.mark.django_db(transaction=True)


def on_the_loop_s_connection(outcomes: list[Outcome], now: Any) -> FinalizeReport:
    async def go() -> FinalizeReport:
        conn = await psycopg.AsyncConnection.connect(
            **{
                **connection.get_connection_params(),
                "cursor_factory": psycopg.AsyncClientCursor,
                "autocommit": True,
            }
        )
        try:
            return await finalize_async(conn, outcomes, now)
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.mark.parametrize("result", [SENT, TERMINAL])
def test_the_copied_events_are_the_inserted_ones(clock, result):
    now = clock.now()
    copied, inserted = claimed_in_app(now, 2)

    def outcome(record: Any, pmid: str) -> Outcome:
        if result == SENT:
            return Outcome(record, SENT, provider_message_id=pmid)
        return Outcome(record, TERMINAL, error="HTTP 400: refused\ttab", error_kind="http_4xx")

    assert finalize([outcome(copied, "m-1")], now).applied
    assert on_the_loop_s_connection([outcome(inserted, "m-2")], now).applied
    events = {e.key: e for e in Outbox.objects.all()}
    by_copy, by_insert = events[str(copied.id)], events[str(inserted.id)]
    for event in (by_copy, by_insert):
        assert event.event_id == outbox_event_id(event.topic, event.key, event.generation)
    columns = ("topic", "contract_version", "generation", "created_at", "published_at")
    assert [getattr(by_copy, c) for c in columns] == [getattr(by_insert, c) for c in columns]
    assert by_copy.created_at == now

    def same_fields(event: Outbox) -> dict[str, Any]:
        own = ("notification_id", "tenant_id", "provider_message_id")
        return {k: v for k, v in event.payload.items() if k not in own}

    assert same_fields(by_copy) == same_fields(by_insert)
    assert by_copy.payload["notification_id"] == str(copied.id)
    assert by_copy.payload["tenant_id"] == (str(copied.tenant_id) if copied.tenant_id else None)
    if result == SENT:
        pmids = (by_copy.payload["provider_message_id"], by_insert.payload["provider_message_id"])
        assert pmids == ("m-1", "m-2")
