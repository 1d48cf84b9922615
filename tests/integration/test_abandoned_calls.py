"""A provider call that outlives its channel's timeout by the grace is abandoned as a retriable timeout."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from datetime import timedelta
from typing import ClassVar

import pytest
from django.test import override_settings

from notifications_retry.engine.worker import ABANDON_GRACE_SECONDS, Worker
from notifications_retry.models import NotificationEntity
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
RELEASE = threading.Event()


class HangingSyncProvider(Provider):
    key: ClassVar[str] = "hang_sync"

    def send(self, message: OutgoingMessage) -> SendResult:
        RELEASE.wait(60)
        return SendResult(provider_message_id="too-late")


class HangingAsyncProvider(Provider):
    key: ClassVar[str] = "hang_async"

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        await asyncio.sleep(60)
        return SendResult(provider_message_id="too-late")


PROVIDERS = {
    "hang_sync": f"{__name__}.HangingSyncProvider",
    "hang_async": f"{__name__}.HangingAsyncProvider",
}


@pytest.mark.parametrize("provider_key", ["hang_sync", "hang_async"])
@override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": PROVIDERS})
def test_hung_call_is_abandoned_as_a_timeout(clock, provider_key):
    RELEASE.clear()
    channel = ChannelFactory(key="slow", provider_key=provider_key, timeout_seconds=0.5, max_concurrency=2)
    rows = [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=5),
        )
        for _ in range(2)
    ]
    worker = Worker(clock=clock, rng=random.Random(1))
    started = time.monotonic()
    try:
        stats = worker.tick()
    finally:
        RELEASE.set()  # let the abandoned threads of the synchronous provider end
        worker.close()
    elapsed = time.monotonic() - started
    assert stats.retried == 2 and stats.sent == 0
    assert 0.5 + ABANDON_GRACE_SECONDS - 0.1 <= elapsed < 0.5 + ABANDON_GRACE_SECONDS + 1.5, elapsed
    for row in rows:
        row.refresh_from_db()
        assert (row.status, row.error_kind, row.claim_token) == (Status.FAILED, "timeout", None)
        assert row.last_error == "provider did not return within 0.5s"
