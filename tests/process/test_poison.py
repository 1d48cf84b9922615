"""Scenario 9: poison input and broken channels: bounded attempts, healthy records keep flowing."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from django.db import connection

from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from tests.factories import NotificationFactory
from tests.process.conftest import seed_due
from tests.process.helpers import assert_one_event_per_final_outcome, db_now, webhook_channel
from tests.support.http_server import ScriptedServer

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

Status = NotificationEntity.Status
PROVIDERS = {
    "exploding": "tests.support.providers.ExplodingProvider",
    "process_crash": "tests.support.fault_providers.ProcessCrashProvider",
    "recording": "tests.support.fault_providers.RecordingProvider",
}


def ticks(worker: Worker, count: int) -> None:
    try:
        for _ in range(count):
            worker.tick()
            time.sleep(0.05)
    finally:
        worker.close()


def test_poison_payload_and_raising_provider_end_terminal_while_healthy_records_flow(settings):
    settings.NOTIFICATIONS_RETRY = {
        "PROVIDERS": PROVIDERS,
        "CIRCUIT_BREAKER": {"failure_threshold": 1000},
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
    }
    server = ScriptedServer().start()
    try:
        hook = webhook_channel(server.url, max_attempts=3, backoff_base_seconds=1, retry_backoff="fixed")
        exploding = ChannelConfig.objects.create(
            key="bug", provider_key="exploding", max_attempts=3, backoff_base_seconds=1, retry_backoff="fixed"
        )
        due = db_now()
        # A payload Python cannot decode (an object, so the claim reads it): nested deeper than the JSON
        # decoder's recursion limit on every supported Python (3.12 and 3.13 decode 1,200 and 8,000
        # levels), yet within PostgreSQL's stack.
        poison = NotificationFactory(channel=hook, status=Status.FAILED, attempts=1, next_attempt_at=due)
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE notifications_retry_notificationentity SET payload = (repeat('{\"a\":', 12000) "
                "|| '\"x\"' || repeat('}', 12000))::jsonb WHERE id = %s",
                [poison.pk],
            )
        buggy = NotificationFactory(channel=exploding, status=Status.FAILED, attempts=1, next_attempt_at=due)
        seed_due(hook, 50)
        ticks(Worker(rng=random.Random(2), interval=0), 1)
        assert NotificationEntity.objects.filter(status=Status.SENT).count() == 50, "healthy rows flowed"
        deadline = time.monotonic() + 20
        while NotificationEntity.objects.filter(pk__in=[poison.pk, buggy.pk], dead_lettered_at=None).exists():
            assert time.monotonic() < deadline
            ticks(Worker(rng=random.Random(2)), 1)
            time.sleep(0.2)
    finally:
        server.stop()
    # The ORM would decode the poison payload too: read the delivery columns only.
    rows = dict(
        (pk, rest)
        for pk, *rest in NotificationEntity.objects.filter(pk__in=[poison.pk, buggy.pk]).values_list(
            "pk", "status", "dead_lettered_at", "attempts", "error_kind"
        )
    )
    for pk in (poison.pk, buggy.pk):
        status, dead, attempts, _ = rows[pk]
        assert status == Status.FAILED and dead is not None
        assert attempts <= 3
    assert rows[poison.pk][3] == "undecodable_payload"
    assert rows[buggy.pk][3] == "provider_crash"
    assert len(server.requests) == 50, "the poison payload never reached the wire"
    assert Outbox.objects.filter(payload__status="Failed").count() == 2
    assert_one_event_per_final_outcome()


def test_provider_crashing_the_process_is_terminal_after_max_attempts(start_worker, tmp_path: Path):
    call_log = tmp_path / "calls.log"
    crash = ChannelConfig.objects.create(
        key="crash",
        provider_key="process_crash",
        max_attempts=3,
        timeout_seconds=0.5,
        options={"call_log": str(call_log)},
    )
    healthy = ChannelConfig.objects.create(
        key="ok",
        provider_key="recording",
        max_attempts=8,
        timeout_seconds=0.5,
        options={"call_log": str(call_log)},
    )
    seed_due(crash, 1)
    seed_due(healthy, 200)
    settings = {"PROVIDERS": PROVIDERS, "LEASE_GRACE_SECONDS": 0.2}
    restarts = 0
    deadline = time.monotonic() + 60
    # A supervisor's job: start the worker again whenever it dies.
    while (
        NotificationEntity.objects.filter(dead_lettered_at=None).exclude(status=Status.SENT).exists()
        and time.monotonic() < deadline
    ):
        worker = start_worker(["--once", "--batch-size", "1000"], settings, name="crashy")
        status = worker.wait(30)
        restarts += status != 0
        time.sleep(0.3)
    crashed = NotificationEntity.objects.get(channel=crash)
    assert crashed.dead_lettered_at is not None and crashed.error_kind == "attempts_exhausted"
    crash_calls = [line for line in call_log.read_text().splitlines() if str(crashed.pk) in line]
    assert len(crash_calls) == restarts <= 3
    assert NotificationEntity.objects.filter(channel=healthy, status=Status.SENT).count() == 200
    assert_one_event_per_final_outcome()


@pytest.mark.parametrize(
    "provider_key,options,problem",
    [
        ("no_such_provider", {}, "unknown provider key"),
        ("webhook", {}, "needs options['url']"),
    ],
)
def test_broken_channel_makes_no_call_and_is_reported(start_worker, provider_key, options, problem):
    server = ScriptedServer().start()
    try:
        broken = ChannelConfig.objects.create(key="broken", provider_key=provider_key, options=options)
        good = webhook_channel(server.url, key="good")
        seed_due(broken, 5)
        seed_due(good, 5)
        worker = start_worker(["--once"], {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]})
        assert worker.wait(30) == 0
    finally:
        server.stop()
    assert len(server.requests) == 5
    untouched = NotificationEntity.objects.filter(channel=broken).values_list("attempts", "status")
    assert set(untouched) == {(1, "failed")}
    output = worker.output()
    assert "channel-disabled" in output and "due_waiting=5" in output and problem in output, output[-2000:]
