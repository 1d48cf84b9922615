"""With a backlog on inline channels the worker runs a second claim on a connection of its own beside
each of its claims, a task of the same send loop on the worker's one thread; every row is still
delivered once, the batch size still holds, a claim beside that fails is redone on Django's connection,
and a claim that comes back short beside another never ends the tick early."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import psycopg
import pytest
from django.db import OperationalError
from structlog.testing import capture_logs

from notifications_retry.engine import claiming, dispatcher, ports
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from notifications_retry.providers.stub import StubProvider
from tests.factories import ChannelFactory, due_notifications

Status = NotificationEntity.Status


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(dispatcher, "CLAIM_CHUNK_SIZE", 20)


@pytest.fixture
def claims_seen(monkeypatch):
    """(thread name, backend pid, rows) of every claim the worker makes on a connection of its own."""
    seen: list[tuple[str, int, int]] = []
    real = claiming.claim_due_async

    async def recording(conn: Any, *args: Any, **kwargs: Any) -> Any:
        batch = await real(conn, *args, **kwargs)
        seen.append(
            (threading.current_thread().name, conn.info.backend_pid, len(batch.records) + len(batch.settled))
        )
        return batch

    monkeypatch.setattr(claiming, "claim_due_async", recording)
    return seen


@contextlib.contextmanager
def worker_of(clock, batch_size: int = 1000) -> Iterator[Worker]:
    """A worker on the test's clock, closed (its connections with it) when the block ends."""
    worker = Worker(batch_size=batch_size, max_duration=60, clock=clock)
    try:
        yield worker
    finally:
        worker.close()


def one_tick(clock, batch_size: int = 1000) -> Any:
    """The stats of one ``--once`` tick of a fresh worker."""
    with worker_of(clock, batch_size) as worker:
        [stats] = worker.run(once=True)
    return stats


def use_provider(settings, key: str, provider: type) -> None:
    """Register ``provider`` (a class of this module) under ``key``."""
    settings.NOTIFICATIONS_RETRY = {
        **settings.NOTIFICATIONS_RETRY,
        "PROVIDERS": {key: f"{__name__}.{provider.__name__}"},
    }


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
def test_an_inline_backlog_is_claimed_on_two_connections_of_one_thread_and_every_row_delivered_once(
    small_chunks, claims_seen, clock
):
    rows = stub_rows(clock, "bulk", 260) + stub_rows(clock, "few", 30)
    threads_before = set(threading.enumerate())
    with worker_of(clock) as worker:
        [stats] = worker.run(once=True)
        assert not worker.beside_connection.open, "the claim beside closes its connection with the tick"
    assert stats.sent == stats.processed == stats.claims == 290 and not stats.error
    assert {name for name, _, got in claims_seen if got} == {threading.current_thread().name}
    assert len({pid for _, pid, got in claims_seen if got}) == 2, "two connections claimed"
    # Only new threads count: one an earlier test left behind (an HTTP server's request thread) may end
    # meanwhile, which is no thread of this worker's.
    assert set(threading.enumerate()) - threads_before == set(), "no thread started"
    assert_delivered_once(rows)


@pytest.mark.django_db(transaction=True)
def test_while_claims_run_two_at_a_time_djangos_connection_is_handed_back(small_chunks, monkeypatch, clock):
    """The worker's third connection is the claim beside: Django's, idle meanwhile, is closed while it
    runs, and opened again by the tick's bookkeeping."""
    from django.db import connection

    # Whether Django's connection was open each time the worker waited for one of two claims under way
    # (read on the worker's thread, between the loop's steps).
    open_while_paired: list[bool] = []
    real = claiming.Claims._take_first

    def recording(self: claiming.Claims, bound: Any) -> None:
        if len(self.under_way) == 2:
            open_while_paired.append(connection.connection is not None)
        real(self, bound)

    monkeypatch.setattr(claiming.Claims, "_take_first", recording)
    rows = stub_rows(clock, "bulk", 260)
    assert connection.connection is not None  # the rows were written on it
    with worker_of(clock) as worker:
        [stats] = worker.run(once=True)
        assert open_while_paired, "claims ran two at a time"
        assert not any(open_while_paired), open_while_paired
        assert connection.connection is not None, "the tick's bookkeeping opened Django's connection again"
    assert stats.sent == 260 and not stats.error
    assert_delivered_once(rows)


@pytest.mark.django_db(transaction=True)
def test_paired_claims_keep_to_the_batch_size(small_chunks, claims_seen, clock):
    rows = stub_rows(clock, "bulk", 300)
    stats = one_tick(clock, batch_size=130)
    assert len({pid for _, pid, _ in claims_seen}) == 2
    assert stats.claims == stats.sent == 130
    sent = set(NotificationEntity.objects.filter(status=Status.SENT).values_list("pk", flat=True))
    assert len(sent) == 130
    assert_delivered_once([r for r in rows if r.pk in sent])


@pytest.fixture
def beside_fails_once(small_chunks, monkeypatch, clock):
    """200 due stub rows and a worker whose first claim on its second connection fails as a dropped
    connection does; yields (rows, worker, the failed claims' backend pids)."""
    rows = stub_rows(clock, "bulk", 200)
    real = claiming.claim_due_async
    failed: list[int] = []
    with worker_of(clock) as worker:

        async def failing_once(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if conn is worker.beside_connection._conn and not failed:
                failed.append(conn.info.backend_pid)
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return await real(conn, *args, **kwargs)

        monkeypatch.setattr(claiming, "claim_due_async", failing_once)
        yield rows, worker, failed


@pytest.mark.django_db(transaction=True)
def test_a_claim_beside_that_fails_is_redone_on_djangos_connection_and_the_tick_goes_on(beside_fails_once):
    rows, worker, failed = beside_fails_once
    with capture_logs() as logs:
        [stats] = worker.run(once=True)
    assert failed, "the claim beside was made and failed"
    [fallback] = [e for e in logs if e["event"] == "claim-fallback"]
    assert fallback["fallback"] == "django-connection" and "server closed" in fallback["error"]
    assert stats.sent == 200 and not stats.error
    assert_delivered_once(rows)


@pytest.mark.django_db(transaction=True)
def test_a_claim_beside_whose_redo_fails_too_ends_the_tick_and_loses_nothing(beside_fails_once, monkeypatch):
    rows, worker, failed = beside_fails_once
    real = ports.claim_due
    redone: list[int] = []

    def failing_redo(*args: Any, **kwargs: Any) -> Any:
        if failed and not redone:
            redone.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    monkeypatch.setattr(ports, "claim_due", failing_redo)
    [first] = worker.run(once=True)
    assert redone and first.error, "the redo's error reached the tick"
    assert first.sent < 200
    [second] = worker.run(once=True)
    assert first.sent + second.sent == 200
    assert_delivered_once(rows)


@pytest.mark.django_db(transaction=True)
def test_a_second_connection_that_cannot_be_opened_leaves_the_claims_one_at_a_time(
    small_chunks, claims_seen, clock, monkeypatch
):
    rows = stub_rows(clock, "bulk", 200)

    def refused() -> None:
        raise psycopg.OperationalError("connection refused")

    with worker_of(clock) as worker, capture_logs() as logs:
        monkeypatch.setattr(worker.beside_connection, "connect", refused)
        [stats] = worker.run(once=True)
    [unavailable] = [e for e in logs if e["event"] == "claim-beside-unavailable"]
    assert unavailable["error"] == "OperationalError: connection refused"
    assert stats.sent == 200 and not stats.error
    assert len({pid for _, pid, _ in claims_seen}) == 1, "every claim on the claims' own connection"
    assert_delivered_once(rows)


@pytest.mark.django_db
def test_claims_are_one_at_a_time_inside_a_transaction(small_chunks, claims_seen, clock, monkeypatch):
    on_django: list[int] = []
    real = ports.claim_due

    def recording(*args: Any, **kwargs: Any) -> Any:
        on_django.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ports, "claim_due", recording)
    rows = stub_rows(clock, "bulk", 90)
    with worker_of(clock) as worker:
        assert worker.dispatcher.claims.beside_connection is None
        [stats] = worker.run(once=True)
    assert stats.sent == 90
    # Inside a test's transaction: Django's connection alone sees the rows.
    assert on_django and not claims_seen
    assert_delivered_once(rows)


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
        cls.threads.add(threading.current_thread().name)
        time.sleep(0.0002)  # would let another thread run, were one allowed to send now
        cls.active -= 1
        return super().send(message)


@pytest.mark.django_db(transaction=True)
def test_two_inline_sends_never_run_at_once(settings, small_chunks, claims_seen, clock):
    use_provider(settings, "overlap", OverlapProvider)
    OverlapProvider.most, OverlapProvider.threads = 0, set()
    rows = due_notifications(clock, ChannelFactory(key="bulk", provider_key="overlap"), 200)
    stats = one_tick(clock)
    assert stats.sent == 200
    assert len({pid for _, pid, _ in claims_seen}) == 2, "two claims settled side by side"
    assert OverlapProvider.threads == {threading.current_thread().name}
    assert OverlapProvider.most == 1, "the two claims' settling takes turns on the one thread"
    assert_delivered_once(rows)


class GoneMailboxProvider(StubProvider):
    """An inline provider whose every recipient's mailbox is gone."""

    key = "gone"

    def send(self, message):
        from notifications_retry.exceptions import PermanentProviderError

        raise PermanentProviderError(
            "SMTP 550 at RCPT TO: 5.1.1 No such user here", kind="mailbox_unavailable"
        )


@pytest.mark.django_db(transaction=True)
def test_a_gone_mailbox_settled_in_a_claim_on_the_loop_is_written_on_djangos_connection(settings, clock):
    from notifications_retry.inputs.validation import normalize_recipient
    from notifications_retry.models import Suppression

    use_provider(settings, "gone", GoneMailboxProvider)
    rows = due_notifications(clock, ChannelFactory(key="mail", provider_key="gone"), 3)
    stats = one_tick(clock)
    assert stats.terminal == 3 and not stats.error
    ids = [r.pk for r in rows]
    kinds = set(NotificationEntity.objects.filter(pk__in=ids).values_list("error_kind", flat=True))
    assert kinds == {"mailbox_unavailable"}
    addresses = {normalize_recipient(r.recipient) for r in rows}
    assert set(Suppression.objects.values_list("address", flat=True)) == addresses
