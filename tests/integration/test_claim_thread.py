"""With a backlog on inline channels the worker runs a second claim on a connection of its own beside
each of its own claims; every row is still delivered once, the batch size still holds, and a claim
that comes back short beside another never ends the tick early."""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import pytest
from django.db import OperationalError, connection

from notifications_retry.engine import ports
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from notifications_retry.providers.stub import StubProvider
from tests.factories import ChannelFactory, due_notifications

Status = NotificationEntity.Status
CLAIMER = "notifications-retry-claimer"


@pytest.fixture
def small_chunks(settings):
    settings.NOTIFICATIONS_RETRY = {**settings.NOTIFICATIONS_RETRY, "CLAIM_CHUNK_SIZE": 20}


@pytest.fixture
def claims_seen(monkeypatch):
    """(thread name, backend pid, rows) of every claim the worker makes."""
    seen: list[tuple[str, int, int]] = []
    real = ports.claim_due

    def recording(*args, **kwargs):
        batch = real(*args, **kwargs)
        seen.append(
            (
                threading.current_thread().name,
                connection.connection.info.backend_pid,
                len(batch.records) + len(batch.settled),
            )
        )
        return batch

    monkeypatch.setattr(ports, "claim_due", recording)
    return seen


def stub_rows(clock, key: str, count: int) -> list[NotificationEntity]:
    return due_notifications(clock, ChannelFactory(key=key, provider_key="stub"), count)


def assert_delivered_once(rows: list[NotificationEntity]) -> None:
    ids = [r.pk for r in rows]
    assert set(NotificationEntity.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        Status.SENT
    }
    keys = list(Outbox.objects.filter(key__in=[str(i) for i in ids]).values_list("key", flat=True))
    assert sorted(keys) == sorted(str(i) for i in ids), "one event per delivered row"
    assert set(NotificationEntity.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == {2}


@pytest.mark.django_db(transaction=True)
def test_an_inline_backlog_is_claimed_on_two_connections_and_every_row_delivered_once(
    small_chunks, claims_seen, clock
):
    rows = stub_rows(clock, "bulk", 260) + stub_rows(clock, "few", 30)
    worker = Worker(batch_size=1000, max_duration=60, clock=clock)
    try:
        [stats] = worker.run(once=True)
    finally:
        worker.close()
    assert stats.sent == stats.processed == stats.claims == 290 and not stats.error
    here = threading.current_thread().name
    threads = {name if name == here else name.split("_")[0] for name, _, got in claims_seen if got}
    assert threads == {here, CLAIMER}, "claims ran on the worker's thread and on the claim thread"
    assert len({pid for _, pid, _ in claims_seen}) == 2, "each on its own connection"
    assert_delivered_once(rows)
    assert not [t for t in threading.enumerate() if t.name.startswith(CLAIMER)], "the thread ended"


@pytest.mark.django_db(transaction=True)
def test_paired_claims_keep_to_the_batch_size(small_chunks, claims_seen, clock):
    rows = stub_rows(clock, "bulk", 300)
    worker = Worker(batch_size=130, max_duration=60, clock=clock)
    try:
        [stats] = worker.run(once=True)
    finally:
        worker.close()
    assert any(name.startswith(CLAIMER) for name, _, _ in claims_seen)
    assert stats.claims == stats.sent == 130
    assert NotificationEntity.objects.filter(status=Status.SENT).count() == 130
    assert_delivered_once(
        [
            r
            for r in rows
            if r.pk in set(NotificationEntity.objects.filter(status=Status.SENT).values_list("pk", flat=True))
        ]
    )


@pytest.mark.django_db(transaction=True)
def test_a_failed_claim_on_the_claim_thread_ends_the_tick_and_loses_nothing(small_chunks, monkeypatch, clock):
    rows = stub_rows(clock, "bulk", 200)
    real = ports.claim_due
    failed: list[str] = []

    def failing_once(*args, **kwargs):
        if threading.current_thread().name.startswith(CLAIMER) and not failed:
            failed.append(threading.current_thread().name)
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(ports, "claim_due", failing_once)
    worker = Worker(batch_size=1000, max_duration=60, clock=clock)
    try:
        [first] = worker.run(once=True)
        assert failed and first.error, "the claim thread's error reached the tick"
        assert first.sent < 200
        [second] = worker.run(once=True)
    finally:
        worker.close()
    assert first.sent + second.sent == 200
    assert_delivered_once(rows)


@pytest.mark.parametrize(
    "claim_thread",
    [
        pytest.param(True, marks=pytest.mark.django_db, id="inside-a-transaction"),
        pytest.param(False, marks=pytest.mark.django_db(transaction=True), id="turned-off"),
    ],
)
def test_claims_are_one_at_a_time_inside_a_transaction_or_when_turned_off(
    settings, small_chunks, claims_seen, clock, claim_thread
):
    settings.NOTIFICATIONS_RETRY = {**settings.NOTIFICATIONS_RETRY, "CLAIM_THREAD": claim_thread}
    rows = stub_rows(clock, "bulk", 90)
    worker = Worker(batch_size=1000, max_duration=60, clock=clock)
    assert worker.dispatcher.claims.claim_thread is None
    [stats] = worker.run(once=True)
    assert stats.sent == 90
    assert {name for name, _, _ in claims_seen} == {threading.current_thread().name}
    assert_delivered_once(rows)


@pytest.mark.django_db
def test_claim_thread_must_be_a_bool(settings):
    from notifications_retry.conf import get_settings, settings_problems

    settings.NOTIFICATIONS_RETRY = {"CLAIM_THREAD": 1}
    assert any("CLAIM_THREAD must be True or False" in p for p in settings_problems(get_settings()))


class OverlapProvider(StubProvider):
    """An inline provider that notes how many of its sends ran at once, and on which threads."""

    key = "overlap"
    active = 0
    most = 0
    threads: ClassVar[set[str]] = set()

    def send(self, message):
        cls = type(self)
        cls.active += 1
        cls.most = max(cls.most, cls.active)
        cls.threads.add(threading.current_thread().name.split("_")[0])
        time.sleep(0.0002)  # lets the other claiming thread run, were it allowed to send now
        cls.active -= 1
        return super().send(message)


@pytest.mark.django_db(transaction=True)
def test_two_inline_sends_never_run_at_once(settings, small_chunks, clock):
    settings.NOTIFICATIONS_RETRY = {
        **settings.NOTIFICATIONS_RETRY,
        "PROVIDERS": {"overlap": f"{__name__}.OverlapProvider"},
    }
    OverlapProvider.most, OverlapProvider.threads = 0, set()
    rows = due_notifications(clock, ChannelFactory(key="bulk", provider_key="overlap"), 200)
    worker = Worker(batch_size=1000, max_duration=60, clock=clock)
    try:
        [stats] = worker.run(once=True)
    finally:
        worker.close()
    assert stats.sent == 200
    assert CLAIMER in OverlapProvider.threads and len(OverlapProvider.threads) == 2
    assert OverlapProvider.most == 1, "settling is serialized across the two claiming threads"
    assert_delivered_once(rows)
