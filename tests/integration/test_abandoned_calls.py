"""A provider call that outlives its channel's timeout by the grace is abandoned as a retriable timeout."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import ClassVar

import pytest
from django.test import override_settings
from structlog.testing import capture_logs

from notifications_retry.engine.worker import ABANDON_GRACE_SECONDS, Worker
from notifications_retry.models import NotificationEntity
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult
from tests.factories import ChannelFactory
from tests.support.due_rows import due_rows

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
    rows = due_rows(clock, channel, None, 2, ago=5, spread=0)
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


@override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": PROVIDERS})
def test_a_record_started_after_the_deadline_has_its_whole_timeout_and_is_not_abandoned(clock):
    # One call at a time, each timing out at 1 s: calls start at 0 s, 1 s and 2 s. The tick stops
    # claiming at 1.3 s, holding the record that starts at 2 s: its timeout ends at 3 s, past the
    # deadline plus the calls' bound (1.3 + 1.0 + 0.5), so a bound counted from the deadline abandoned
    # it and left its row leased; counted from each call's start, its timeout is committed.
    channel = ChannelFactory(key="slow", provider_key="hang_async", timeout_seconds=1.0, max_concurrency=1)
    due_rows(clock, channel, None, 10, ago=5, spread=0)
    worker = Worker(clock=clock, rng=random.Random(1), max_duration=1.3)
    try:
        with capture_logs() as logs:
            stats = worker.tick()
    finally:
        worker.close()
    assert not [e for e in logs if e["event"] == "calls-abandoned"], logs
    tried = NotificationEntity.objects.filter(attempts=2)
    assert stats.retried == tried.count() >= 2
    assert set(tried.values_list("status", "error_kind", "claim_token")) == {(Status.FAILED, "timeout", None)}
