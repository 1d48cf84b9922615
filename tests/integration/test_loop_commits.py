"""The worker commits outcomes on its send loop, on the connection its claims use in turn; a batch
that needs Django's ORM, or whose statements fail there, is committed on Django's connection — and
everything is inline inside a transaction (a test's), which no other connection could see."""

from __future__ import annotations

import asyncio
import random
import threading
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from structlog.testing import capture_logs

from notifications_retry.delivery import FinalizeReport
from notifications_retry.engine import dispatcher
from notifications_retry.engine.completer import Completer, LoopCompleter
from notifications_retry.engine.worker import Worker
from notifications_retry.models import (
    CHANNEL_HEALTH_TOPIC,
    ChannelConfig,
    ChannelHealthChange,
    NotificationEntity,
    Outbox,
    Suppression,
)
from notifications_retry.rules.outcomes import TERMINAL, Outcome
from tests.conftest import allow_loopback
from tests.factories import ChannelFactory, NotificationFactory, due_notifications
from tests.support.http_server import Reply
from tests.support.records import claimed_record

Status = NotificationEntity.Status


def rows(clock, server_url: str, count: int) -> list[NotificationEntity]:
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": server_url}, max_concurrency=4
    )
    return due_notifications(clock, channel, count)


def own_params() -> dict:
    """Django's connection parameters, for a connection of the test's own."""
    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def own_backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return int(pid)


class Recorder:
    """Wraps a LoopCompleter's commits on the loop, and its commits on Django's connection."""

    def __init__(self, completer: LoopCompleter) -> None:
        self.on_loop: list[tuple[str, int, int]] = []  # thread, backend pid, outcomes
        self.on_django: list[int] = []
        self._loop_commit = completer._commit_async
        completer._commit_async = self._commit_on_loop
        inner = completer._completer
        self._django_commit = inner._commit
        inner._commit = self._commit_on_django
        self.completer = completer

    async def _commit_on_loop(self, batch: list[Outcome], now) -> FinalizeReport:
        report = await self._loop_commit(batch, now)
        pid = self.completer._connection._conn.info.backend_pid
        self.on_loop.append((threading.current_thread().name, pid, len(batch)))
        return report

    def _commit_on_django(self, batch: list[Outcome], now) -> FinalizeReport:
        self.on_django.append(len(batch))
        return self._django_commit(batch, now)


@pytest.mark.django_db(transaction=True)
def test_outcomes_are_committed_on_the_loops_own_connection_on_the_workers_thread(webhook_server, clock):
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    created = rows(clock, webhook_server.url, 12)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    assert isinstance(worker.completer, LoopCompleter)
    recorder = Recorder(worker.completer)
    claimed_on: set[int] = set()
    claim = worker.claim_connection.claim

    async def recording_claim(*args, **kwargs):
        batch = await claim(*args, **kwargs)
        claimed_on.add(worker.claim_connection._conn.info.backend_pid)
        return batch

    worker.claim_connection.claim = recording_claim
    try:
        [stats] = worker.run(once=True)
        own_pid = own_backend_pid()
    finally:
        worker.close()
    assert stats.sent == 12 and stats.processed == 12, "every report reached the tick's stats"
    assert sum(n for _, _, n in recorder.on_loop) == 12 and recorder.on_django == []
    assert {name for name, _, _ in recorder.on_loop} == {threading.current_thread().name}
    assert own_pid not in {pid for _, pid, _ in recorder.on_loop}, "commits ran beside Django's connection"
    # The claims and the commits take turns on the send loop's one connection.
    assert {pid for _, pid, _ in recorder.on_loop} == claimed_on
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}
    assert Outbox.objects.filter(key__in=[str(r.pk) for r in created]).count() == 12
    assert not worker.completer._connection.open, "the worker's close closed the loop's connection"


@pytest.mark.django_db(transaction=True)
def test_a_health_change_is_committed_on_djangos_connection_with_its_batch(webhook_server, clock, settings):
    settings.NOTIFICATIONS_RETRY = {
        **settings.NOTIFICATIONS_RETRY,
        "CIRCUIT_BREAKER": {"failure_threshold": 10_000},
    }
    allow_loopback(settings)
    webhook_server.responder = lambda r: Reply(410, "gone")
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": webhook_server.url}, max_concurrency=1
    )
    [row] = due_notifications(clock, channel, 1)
    worker = Worker(batch_size=50, max_duration=30, clock=clock, rng=random.Random(3))
    recorder = Recorder(worker.completer)
    try:
        worker.run(once=True)
    finally:
        worker.close()
    assert recorder.on_loop == [] and recorder.on_django == [1], "the loop left the batch to Django's"
    channel.refresh_from_db()
    assert (channel.health_state, channel.is_enabled) == ("disabled", False)
    assert ChannelHealthChange.objects.filter(channel=channel, state="disabled").count() == 1
    assert Outbox.objects.filter(topic=CHANNEL_HEALTH_TOPIC, key="hook").count() == 1
    row.refresh_from_db()
    assert row.dead_lettered_at is not None and row.claim_token is None
    assert Outbox.objects.filter(key=str(row.pk)).count() == 1, "the outcome's event, once"


@pytest.mark.django_db(transaction=True)
def test_the_loop_commits_nothing_while_its_batch_for_djangos_connection_waits(
    webhook_server, clock, settings, monkeypatch
):
    # The failure that puts the channel in warning goes to Django's connection (a health change); the
    # deliveries behind it share the channel's health bucket. A loop commit of one of them, left
    # mid-transaction while the worker's thread committed on Django's connection, held the bucket's row
    # that commit waited for: neither ended.
    settings.NOTIFICATIONS_RETRY = {
        **settings.NOTIFICATIONS_RETRY,
        "ENDPOINT_HEALTH": {"min_attempts": 2, "warn_ratio": 0.5, "disable_ratio": 1.0},
        "CIRCUIT_BREAKER": {"failure_threshold": 10_000},
    }
    # A batch an outcome: the next one is ready as the warning's is handed over.
    monkeypatch.setattr(dispatcher, "CLAIM_CHUNK_SIZE", 1)
    allow_loopback(settings)
    answers = iter([Reply(200, {"id": "m"}), Reply(500, "down")] + [Reply(200, {"id": "m"})] * 20)
    webhook_server.responder = lambda r: next(answers)
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": webhook_server.url}, max_concurrency=1
    )
    due_notifications(clock, channel, 12)
    with connection.cursor() as cursor:  # a wait for a row lock fails here instead of hanging the test
        cursor.execute("SET lock_timeout = '2s'")
    worker = Worker(batch_size=50, max_duration=30, clock=clock, rng=random.Random(3))
    recorder = Recorder(worker.completer)
    try:
        with capture_logs() as logs:
            [stats] = worker.run(once=True)
    finally:
        worker.close()
    waits = [e for e in logs if e["event"] in ("finalize-fallback", "outcomes-commit-deferred")]
    assert waits == [], waits
    # Two batches on Django's connection: the failure (1 of 2: warning) and the delivery after it (1 of
    # 3: back to ok); every other one on the loop.
    assert stats.processed == 12 and recorder.on_django == [1, 1], recorder.on_django
    assert sum(n for _, _, n in recorder.on_loop) == 10
    changes = ChannelHealthChange.objects.filter(channel=channel).order_by("pk")
    assert [c.state for c in changes] == ["warning", "ok"]
    assert NotificationEntity.objects.filter(claim_token__isnull=False).count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_gone_mailbox_is_suppressed_by_a_commit_on_djangos_connection(clock):
    channel = ChannelConfig.objects.create(
        key="mail", provider_key="stub", options={"delay_seconds": 0.001}, timeout_seconds=5
    )
    record = NotificationFactory(
        channel=channel, status=Status.FAILED, attempts=0, recipient="gone@example.com"
    )
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    completer = worker.completer
    assert isinstance(completer, LoopCompleter)
    recorder = Recorder(completer)
    with connection.cursor() as cursor:  # leased by hand, as a claim leaves it
        cursor.execute(
            "UPDATE notifications_retry_notificationentity SET claim_token = gen_random_uuid(), "
            "claim_expires_at = %s, attempts = 1 WHERE id = %s RETURNING claim_token",
            [clock.now() + timedelta(minutes=5), record.pk],
        )
        (token,) = cursor.fetchone()
    leased = claimed_record(
        id=record.pk,
        channel_id=channel.pk,
        claim_token=token,
        attempts=1,
        recipient="gone@example.com",
        lease_expires_at=clock.now() + timedelta(minutes=5),
    )
    gone = Outcome(
        leased, TERMINAL, error="SMTP 550 at RCPT TO: 5.1.1 no such user", error_kind="mailbox_unavailable"
    )
    try:
        completer.add([gone])
        while completer.pending:
            if completer.due(flush=True):
                completer.commit(completer.bound)
            completer.wait(0.05)
    finally:
        worker.close()
    assert recorder.on_loop == [] and recorder.on_django == [1]
    assert Suppression.objects.filter(address="gone@example.com").exists()
    record.refresh_from_db()
    assert record.dead_lettered_at is not None and record.claim_token is None


@pytest.mark.django_db(transaction=True)
def test_a_batch_the_loops_connection_fails_is_committed_on_djangos(webhook_server, clock):
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    rows(clock, webhook_server.url, 6)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    recorder = Recorder(worker.completer)

    def wrong_database(self) -> dict:
        return {**type(self)._params(self), "dbname": "nr_no_such_database"}

    connection_ = worker.completer._connection
    connection_._params = wrong_database.__get__(connection_)
    try:
        with capture_logs() as logs:
            [stats] = worker.run(once=True)
    finally:
        worker.close()
    assert stats.sent == 6 and recorder.on_loop == [] and sum(recorder.on_django) == 6
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}
    fallbacks = [e for e in logs if e["event"] == "commit-fallback"]
    assert fallbacks and fallbacks[0]["fallback"] == "django-connection"


@pytest.mark.django_db(transaction=True)
def test_a_commit_connection_the_server_ended_is_opened_again_by_the_worker_not_by_the_task(
    webhook_server, clock, monkeypatch
):
    channel = ChannelFactory(key="hook", provider_key="webhook", options={"url": webhook_server.url})
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    recorder = Recorder(worker.completer)
    connects: list[str] = []
    real_connect = psycopg.AsyncConnection.connect
    ended: list[int] = []

    async def recording_connect(*args, **kwargs):
        # A connect left half done while the loop stands still holds a restarting server up: the
        # commits' task must never be the one connecting.
        connects.append(asyncio.current_task().get_coro().__qualname__)
        return await real_connect(*args, **kwargs)

    def end_the_loop_connection(request) -> Reply:
        # During a call: the claim's transaction is over, the commit's has not begun.
        if not ended:
            ended.append(worker.claim_connection._conn.info.backend_pid)
            with psycopg.connect(**own_params(), autocommit=True) as other:
                other.execute("SELECT pg_terminate_backend(%s)", [ended[0]])
        return Reply(200, {"id": "m"})

    monkeypatch.setattr(psycopg.AsyncConnection, "connect", recording_connect)
    try:
        webhook_server.responder = lambda r: Reply(200, {"id": "m"})
        due_notifications(clock, channel, 3)
        worker.tick()  # not run(): it closes the worker's connections when it returns
        # On a loaded machine the completer's delay can end between two answers: one tick's outcomes
        # may then be committed in more than one batch, so the assertions count outcomes, not batches.
        first_tick = list(recorder.on_loop)
        [first_pid] = {pid for _, pid, _ in first_tick}
        assert sum(n for _, _, n in first_tick) == 3
        webhook_server.responder = end_the_loop_connection
        due_notifications(clock, channel, 3)
        with capture_logs() as logs:
            worker.tick()  # its commit finds the connection ended: Django's connection commits it
        webhook_server.responder = lambda r: Reply(200, {"id": "m"})
        due_notifications(clock, channel, 3)
        worker.tick()  # its claim opens a new connection, on which the commits go on
    finally:
        worker.close()
    assert ended == [first_pid], "the claims and the commits share the loop's connection"
    [fallback] = [e for e in logs if e["event"] == "commit-fallback"]
    assert fallback["fallback"] == "django-connection"
    later = recorder.on_loop[len(first_tick) :]
    # The batch that found the connection ended went to Django's; the rest of the six, on the loop again.
    assert recorder.on_django and sum(recorder.on_django) + sum(n for _, _, n in later) == 6
    assert later and all(pid != first_pid for _, pid, _ in later), "a new connection took the ended one's"
    assert connects and "LoopCompleter._commits" not in connects, connects
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}


@pytest.mark.django_db
def test_commits_are_inline_inside_a_transaction(webhook_server, settings, clock):
    webhook_server.responder = lambda r: Reply(200, {"id": "m"})
    rows(clock, webhook_server.url, 3)
    worker = Worker(batch_size=50, max_duration=30, clock=clock)
    assert type(worker.completer) is Completer
    [stats] = worker.run(once=True)
    assert stats.sent == 3
    assert set(NotificationEntity.objects.values_list("status", flat=True)) == {Status.SENT}
