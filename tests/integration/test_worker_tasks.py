"""A looping worker relays the outbox and runs housekeeping on its loop, on PostgreSQL and a real HTTP
server on 127.0.0.1: events published soon after they are written, on the connections the worker has,
and neither a publisher that is down nor a housekeeping error stops its sends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from structlog.testing import capture_logs

from notifications_retry import api
from notifications_retry.database.locks import AdvisoryLock
from notifications_retry.engine.loop_tasks import OutboxGauges
from notifications_retry.engine.worker import Worker
from notifications_retry.housekeeping import BACKLOG_SAMPLE_RETENTION_HOURS, HousekeepingTask
from notifications_retry.models import BacklogSample, NotificationEntity, Outbox
from notifications_retry.observability import metrics
from notifications_retry.outbox import relay
from notifications_retry.outbox.publishers import LogPublisher
from notifications_retry.outbox.relay import LOCK_CLASS, Relay, relay_task
from notifications_retry.runtime.clock import ManualClock
from tests.conftest import allow_loopback
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer
from tests.support.outbox_events import make_events

Status = NotificationEntity.Status

#: The longest a test waits for what the worker does within a second or two.
WAIT_SECONDS = 20.0


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@contextmanager
def looping(worker: Worker) -> Iterator[None]:
    """``worker.run()`` on a thread of its own (its own Django connection), stopped at the end."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="test-worker")
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(30)
        assert not thread.is_alive(), "the worker did not stop"
        assert not errors, errors


def due(channel, count: int = 1) -> list[NotificationEntity]:
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=timezone.now() - timedelta(seconds=1),
        )
        for _ in range(count)
    ]


def http_publisher_settings(settings, server: ScriptedServer, **extra) -> None:
    allow_loopback(settings)
    settings.NOTIFICATIONS_RETRY = {
        **settings.NOTIFICATIONS_RETRY,
        "OUTBOX_PUBLISHER": "http",
        "OUTBOX_PUBLISHER_OPTIONS": {"url": server.url, "retries": 0, "timeout_seconds": 5},
        **extra,
    }


def relaying_worker(**options) -> Worker:
    # An interval of a minute: what is published within seconds was published by the loop's relay,
    # not by a tick at the interval's end.
    worker = Worker(interval=60, **options)
    worker.tasks.add(relay_task(worker.lock, clock=worker.clock, batch_size=worker.batch_size))
    return worker


def delay_seconds(event: Outbox) -> float:
    assert event.published_at is not None
    return (event.published_at - event.created_at).total_seconds()


def advisory_holders(classid: int) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
            "AND classid = %s::bigint::oid",
            [classid],
        )
        return {row[0] for row in cursor.fetchall()}


def backend_pids(application_name: str) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name])
        return {row[0] for row in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_worker_publishes_its_events_soon_after_writing_them_on_its_lock_session(settings):
    # The receiver holds the first publish until the test has looked: the key locks are held meanwhile,
    # however late a loaded machine lets the test look.
    looked = threading.Event()

    def answer(request: object) -> Reply:
        looked.wait(timeout=30)
        return Reply(200, {})

    server = ScriptedServer(answer).start()
    try:
        http_publisher_settings(settings, server)
        rows = due(ChannelFactory(key="in_app"), 2)
        worker = relaying_worker()
        with looping(worker):
            wait_until(lambda: Outbox.objects.count() == 2, "the tick's events")
            wait_until(lambda: len(server.requests) >= 1, "the relay's first publish")
            key_lock_holders = advisory_holders(LOCK_CLASS)
            seen_relay_connections = backend_pids("notifications_retry relay")
            looked.set()
            while Outbox.objects.filter(published_at__isnull=True).exists():
                seen_relay_connections |= backend_pids("notifications_retry relay")
                time.sleep(0.01)
            lock_sessions = backend_pids("notifications_retry lock")
            sent = [Outbox.objects.get(key=str(r.pk)) for r in rows]
            # Written by someone else while the worker waits for its next tick (a minute away).
            cancelled = NotificationFactory(channel=ChannelFactory(key="in_app"))
            api.cancel_notification(cancelled.pk, actor="shop")
            wait_until(
                lambda: Outbox.objects.filter(key=str(cancelled.pk), published_at__isnull=False).exists(),
                "the cancellation's event published while the worker waits",
            )
            written_meanwhile = Outbox.objects.get(key=str(cancelled.pk))
        assert {r.json()["event_id"] for r in server.requests} == {
            str(e.event_id) for e in [*sent, written_meanwhile]
        }
        delays = [delay_seconds(e) for e in [*sent, written_meanwhile]]
        print(f"event delay from created_at to published_at: {', '.join(f'{d:.3f} s' for d in delays)}")
        # Published by the loop's relay, not at the next tick (a minute away): within a few seconds.
        assert max(delays) < 10, delays
        # The key locks lived on the worker's lock session: relaying opened no connection of its own.
        assert key_lock_holders and key_lock_holders <= lock_sessions
        assert not seen_relay_connections
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_without_the_relay_task_the_events_stay_unpublished(settings):
    server = ScriptedServer().start()
    try:
        http_publisher_settings(settings, server)
        due(ChannelFactory(key="in_app"), 2)
        worker = Worker(interval=60)
        with looping(worker):
            wait_until(lambda: Outbox.objects.count() == 2, "the tick's events")
            time.sleep(1.5)  # longer than the relay's interval: it would have published them
        assert Outbox.objects.filter(published_at__isnull=True).count() == 2
        assert server.requests == []
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_publisher_that_is_down_never_stops_the_sends_and_its_events_go_out_once_it_is_back(
    settings, monkeypatch
):
    # The relay tries again within a second, not a minute: the test waits for the publisher's return.
    monkeypatch.setattr(relay, "OUTBOX_RELAY_MAX_BACKOFF_SECONDS", 1.0)
    state = {"up": False}
    server = ScriptedServer(lambda request: Reply(200 if state["up"] else 503, {})).start()
    try:
        http_publisher_settings(settings, server)
        channel = ChannelFactory(key="in_app")
        first = due(channel, 3)
        failures_before = metrics.TASK_FAILURES.labels("relay")._value.get()
        worker = relaying_worker()
        with looping(worker):
            wait_until(lambda: NotificationEntity.objects.filter(status=Status.SENT).count() == 3, "sends")
            wait_until(lambda: len(server.requests) >= 2, "the relay trying again")
            # Rows due later are still sent while the publisher stays down.
            later = NotificationFactory(channel=channel, status=Status.PENDING, scheduled_at=timezone.now())
            wait_until(
                lambda: NotificationEntity.objects.get(pk=later.pk).status == Status.SENT,
                "a send while the publisher is down",
            )
            assert Outbox.objects.filter(published_at__isnull=True).count() == 4
            state["up"] = True
            wait_until(
                lambda: not Outbox.objects.filter(published_at__isnull=True).exists(),
                "the events published once the publisher is back",
            )
        assert metrics.TASK_FAILURES.labels("relay")._value.get() > failures_before
        assert {r.pk for r in first} <= set(
            NotificationEntity.objects.filter(status=Status.SENT).values_list("pk", flat=True)
        )
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_housekeeping_runs_on_the_loop_and_a_failing_step_never_stops_the_sends(monkeypatch):
    old_sample = BacklogSample.objects.create(
        taken_at=timezone.now() - timedelta(hours=BACKLOG_SAMPLE_RETENTION_HOURS + 1)
    )
    channel = ChannelFactory(key="in_app")
    worker = Worker(interval=60)
    task = HousekeepingTask(worker.lock, clock=worker.clock, monotonic=worker.monotonic)
    task.first_in = 0.0
    worker.tasks.add(task)
    with looping(worker):
        wait_until(lambda: task.runs == 1, "a housekeeping run")
    assert not BacklogSample.objects.filter(pk=old_sample.pk).exists()

    def broken(**_: object) -> int:
        raise RuntimeError("the suppression table is gone")

    monkeypatch.setattr("notifications_retry.housekeeping.prune_expired", broken)
    failures_before = metrics.TASK_FAILURES.labels("housekeeping")._value.get()
    worker = Worker(interval=60)
    task = HousekeepingTask(worker.lock, clock=worker.clock, monotonic=worker.monotonic)
    task.first_in = 0.0
    worker.tasks.add(task)
    with capture_logs() as logs, looping(worker):
        wait_until(
            lambda: metrics.TASK_FAILURES.labels("housekeeping")._value.get() > failures_before,
            "the failed step counted",
        )
        row = NotificationFactory(channel=channel, status=Status.PENDING, scheduled_at=timezone.now())
        wait_until(lambda: NotificationEntity.objects.get(pk=row.pk).status == Status.SENT, "a send")
    failed = [e for e in logs if e["event"] == "worker-task-failed"]
    assert failed and failed[0]["task"] == "housekeeping" and "gone" in failed[0]["error"]
    assert task.runs == 0


@pytest.mark.django_db(transaction=True)
def test_housekeeping_runs_in_one_of_two_workers_at_a_time():
    clock = ManualClock(timezone.now())
    first, second = AdvisoryLock("tests:worker-a"), AdvisoryLock("tests:worker-b")
    try:
        a = HousekeepingTask(first, clock=clock, monotonic=time.monotonic, every=3600)
        b = HousekeepingTask(second, clock=clock, monotonic=time.monotonic, every=3600)
        assert a.run(10.0) == 3600 and a.runs == 1  # a leads: a whole run
        assert b.run(10.0) == 3600 and b.runs == 0  # b does not: it asks again in an hour
        assert a.run(10.0) == 3600 and a.runs == 2  # the leader keeps its role from run to run
        assert b.run(10.0) == 3600 and b.runs == 0
        first.close()  # the leader's session ends (a worker stopped or killed)
        # The other takes over at its next look, once the server has ended the closed session.
        wait_until(lambda: b.run(10.0) == 3600 and b.runs == 1, "the other worker elected")
        assert a.run(10.0) == 3600 and a.runs == 2  # a, reconnected, no longer leads
    finally:
        first.close()
        second.close()


@pytest.mark.django_db
def test_the_outbox_gauges_count_the_unpublished_events_and_the_oldest_s_age(clock):
    make_events(clock, keys=2)  # 4 events, the first written 2 s before the clock's now
    oldest = Outbox.objects.order_by("id").first()
    clock.advance(30)
    OutboxGauges(clock).run(1.0)
    assert metrics.OUTBOX_UNPUBLISHED._value.get() == 4
    expected_age = (clock.now() - oldest.created_at).total_seconds()
    assert metrics.OUTBOX_OLDEST_UNPUBLISHED_AGE._value.get() == pytest.approx(expected_age)
    assert expected_age >= 30
    Relay(LogPublisher(), clock=clock).run(once=True)  # outbox_relay: publishes, then reads its gauges
    assert metrics.OUTBOX_UNPUBLISHED._value.get() == 0
    assert metrics.OUTBOX_OLDEST_UNPUBLISHED_AGE._value.get() == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "tasks"),
    [
        ({}, ["relay", "housekeeping"]),
        ({"no_relay": True}, ["housekeeping"]),
        ({"no_housekeeping": True}, ["relay"]),
        ({"once": True}, ["relay"]),
        ({"no_relay": True, "no_housekeeping": True}, []),
    ],
)
def test_retry_worker_runs_the_tasks_its_options_ask_for(options, tasks):
    from notifications_retry.management.commands.retry_worker import Command

    worker = Worker()
    try:
        Command()._add_tasks(worker, {"no_relay": False, "no_housekeeping": False, "once": False, **options})
        assert "outbox-gauges" in worker.tasks.names  # whoever relays, every worker watches the outbox
        assert [name for name in worker.tasks.names if name in ("relay", "housekeeping")] == tasks
    finally:
        worker.close()


@pytest.mark.django_db
def test_a_worker_serving_no_metrics_reads_no_outbox_gauges(settings):
    """Gauges set in a process nothing scrapes are lost with it: no statement is spent on them."""
    from django.core.management import call_command
    from structlog.testing import capture_logs

    settings.NOTIFICATIONS_RETRY = {"METRICS_PORT": None}
    with capture_logs() as logs:
        call_command("retry_worker", "--once", "--no-relay")
    started = next(e for e in logs if e["event"] == "worker-tasks")
    assert "outbox-gauges" not in started["tasks"]
    assert "unreadable-times" in started["tasks"]


@pytest.mark.django_db
def test_a_publisher_the_settings_cannot_build_is_a_bad_option_of_retry_worker(settings):
    from django.core.management import CommandError, call_command

    settings.NOTIFICATIONS_RETRY = {"OUTBOX_PUBLISHER": "http", "OUTBOX_PUBLISHER_OPTIONS": {}}
    with pytest.raises(CommandError, match="'url' must be an http") as info:
        call_command("retry_worker", "--once")
    assert info.value.returncode == 2
    call_command("retry_worker", "--once", "--no-relay")  # the relay runs elsewhere: nothing to build


@pytest.mark.parametrize(
    ("tick_batch", "relay_batch"), [(50, 100), (200, 200), (5000, relay.RELAY_TASK_BATCH_MAX)]
)
def test_the_workers_relay_batch_follows_its_ticks_within_the_lock_tables_room(tick_batch, relay_batch):
    """A batch holds an advisory lock per key on the worker's session: a worker run with a large
    --batch-size must not take thousands at once (PostgreSQL's shared lock table runs out)."""
    lock = AdvisoryLock("tests:relay-batch")
    try:
        task = relay_task(lock, clock=ManualClock(timezone.now()), batch_size=tick_batch)
        assert task.relay.batch_size == relay_batch
    finally:
        lock.close()
