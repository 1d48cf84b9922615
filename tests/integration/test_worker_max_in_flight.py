"""WORKER_MAX_IN_FLIGHT / --max-in-flight: a worker's calls in flight across all its channels."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import pytest

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer

Status = NotificationEntity.Status


class Gauge:
    """Requests being answered now, and the most seen at once (each answered after 50 ms)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __call__(self, request: object) -> Reply:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.05)
        with self.lock:
            self.now -= 1  # before the answer leaves: the worker cannot start a call it frees first
        return Reply(200, {"id": "x"})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("setting", "option", "cap"), [(3, None, 3), (64, 2, 2)])
def test_the_worker_never_has_more_calls_in_flight_than_its_cap(clock, settings, setting, option, cap):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "WORKER_MAX_IN_FLIGHT": setting}
    gauge = Gauge()
    server = ScriptedServer(gauge).start()
    try:
        rows = []
        for key in ("hooks-a", "hooks-b"):
            channel = ChannelFactory(
                key=key, provider_key="webhook", max_concurrency=8, options={"url": server.url}
            )
            rows += NotificationEntity.objects.bulk_create(
                NotificationFactory.build(
                    channel=channel,
                    status=Status.FAILED,
                    attempts=1,
                    next_attempt_at=clock.now() - timedelta(seconds=60),
                )
                for _ in range(24)
            )
        worker = Worker(clock=clock, rng=random.Random(1), batch_size=1000, max_in_flight=option)
        try:
            stats = worker.tick()
        finally:
            worker.close()
    finally:
        server.stop()
    assert stats.sent == len(rows) == 48
    assert len(server.requests) == 48
    assert 1 <= gauge.most <= cap, gauge.most


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="max in flight"):
        Worker(max_in_flight=0)
