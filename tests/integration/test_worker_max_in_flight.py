"""WORKER_MAX_IN_FLIGHT / --max-in-flight: a worker's calls in flight across all its channels."""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection

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


def due_rows(clock, key: str, url: str, count: int) -> list[NotificationEntity]:
    """``count`` due retries of a webhook channel ``key`` (max_concurrency 8) pointed at ``url``."""
    channel = ChannelFactory(key=key, provider_key="webhook", max_concurrency=8, options={"url": url})
    return NotificationEntity.objects.bulk_create(
        NotificationFactory.build(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=60),
        )
        for _ in range(count)
    )


def one_tick(clock, max_in_flight: int | None):
    worker = Worker(clock=clock, rng=random.Random(1), batch_size=1000, max_in_flight=max_in_flight)
    try:
        return worker.tick()
    finally:
        worker.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("setting", "option", "cap"), [(3, None, 3), (64, 2, 2)])
def test_the_worker_never_has_more_calls_in_flight_than_its_cap(clock, settings, setting, option, cap):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "WORKER_MAX_IN_FLIGHT": setting}
    gauge = Gauge()
    server = ScriptedServer(gauge).start()
    try:
        rows = [*due_rows(clock, "hooks-a", server.url, 24), *due_rows(clock, "hooks-b", server.url, 24)]
        stats = one_tick(clock, option)
    finally:
        server.stop()
    assert stats.sent == len(rows) == 48
    assert len(server.requests) == 48
    assert 1 <= gauge.most <= cap, gauge.most


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="max in flight"):
        Worker(max_in_flight=0)


class CommitWatch:
    """At each request's arrival: how many requests had arrived, and how many rows were committed Sent."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        params = connection.settings_dict
        self.db = psycopg.connect(
            dbname=params["NAME"],
            host=params["HOST"] or None,
            port=params["PORT"] or None,
            user=params["USER"] or None,
            password=params["PASSWORD"] or None,
            autocommit=True,
        )
        self.arrivals: list[tuple[int, int]] = []

    def __call__(self, request: object) -> Reply:
        with self.lock:
            (sent,) = self.db.execute(
                f"SELECT count(*) FROM {NotificationEntity._meta.db_table} WHERE status = 'sent'"
            ).fetchone()
            self.arrivals.append((len(self.arrivals) + 1, sent))
        return Reply(200, {"id": "x"}, delay=0.02)


@pytest.mark.django_db(transaction=True)
def test_a_call_keeps_its_place_under_the_cap_until_its_outcome_is_committed(clock, settings):
    """A worker killed at any moment repeats no more than its cap of calls: when a call starts, all but
    ``cap - 1`` of the calls before it have their outcome committed."""
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    cap = 3
    watch = CommitWatch()
    server = ScriptedServer(watch).start()
    try:
        due_rows(clock, "hooks", server.url, 40)
        stats = one_tick(clock, cap)
    finally:
        server.stop()
        watch.db.close()
    assert stats.sent == 40 and len(watch.arrivals) == 40
    outstanding = [started - committed for started, committed in watch.arrivals]
    assert max(outstanding) <= cap, watch.arrivals
