"""The outbox relay against a real HTTP server on 127.0.0.1: order per key, at least once, never skips."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import jsonschema
import pytest
from django.db import connection
from structlog.testing import capture_logs

from notifications_retry.delivery import events
from notifications_retry.models import Outbox
from notifications_retry.outbox.publishers import HttpPublisher, LogPublisher, get_publisher
from notifications_retry.outbox.publishers.http import KEY_HEADER
from notifications_retry.outbox.relay import Relay
from tests.support.http_server import RecordedRequest, Reply, ScriptedServer
from tests.support.outbox_events import assert_order_per_key, make_events

ROOT = Path(__file__).resolve().parents[2]
VALIDATOR = jsonschema.Draft202012Validator(events.schema(), format_checker=jsonschema.FormatChecker())


def http_relay(server: ScriptedServer, clock, **options) -> Relay:
    publisher_options = {"url": server.url, "retries": 1, "backoff_seconds": 0.01, "timeout_seconds": 5}
    publisher_options.update(options.pop("publisher", {}))
    return Relay(HttpPublisher(publisher_options), clock=clock, sleep=lambda s: None, **options)


def accepted(server: ScriptedServer, statuses: dict[int, int]) -> list[dict]:
    """Bodies of the requests the server answered 2xx, in order of receipt."""
    with server.lock:
        requests = list(server.requests)
    return [r.json() for i, r in enumerate(requests) if 200 <= statuses.get(i, 200) < 300]


def assert_everything_published_once_each(server: ScriptedServer) -> None:
    bodies = [r.json() for r in server.requests]
    ids = [b["event_id"] for b in bodies]
    assert len(ids) == len(set(ids)), "an event was published twice without a crash"
    assert set(ids) == {str(e) for e in Outbox.objects.values_list("event_id", flat=True)}
    assert not Outbox.objects.filter(published_at__isnull=True).exists()
    assert_order_per_key(bodies)


# --- publishers ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_log_publisher_writes_one_structured_line_per_event_and_marks_them(clock):
    make_events(clock, keys=2)
    with capture_logs() as logs:
        reports = Relay(LogPublisher(), clock=clock, batch_size=3).run(once=True)
    lines = [entry for entry in logs if entry["event"] == "outbox-event-published"]
    assert [line["event_id"] for line in lines] == [
        str(e) for e in Outbox.objects.order_by("id").values_list("event_id", flat=True)
    ]
    assert lines[0]["payload"]["status"] == "Failed" and lines[-1]["payload"]["status"] == "Sent"
    assert sum(r.published for r in reports) == 4
    assert set(Outbox.objects.values_list("published_at", flat=True)) == {clock.now()}


@pytest.mark.django_db
def test_http_publisher_posts_the_schema_valid_event_with_its_key_header(clock, webhook_server):
    make_events(clock, keys=3)
    http_relay(webhook_server, clock).run(once=True)
    assert_everything_published_once_each(webhook_server)
    for request in webhook_server.requests:
        body = request.json()
        VALIDATOR.validate(body)
        assert request.headers[KEY_HEADER.lower()] == body["key"] == body["payload"]["notification_id"]
        assert request.headers["idempotency-key"] == body["event_id"]
        assert request.headers["content-type"] == "application/json"
    # Creation order overall, not only per key: the relay publishes oldest first.
    assert [r.json()["event_id"] for r in webhook_server.requests] == [
        str(e) for e in Outbox.objects.order_by("id").values_list("event_id", flat=True)
    ]


def test_unknown_publisher_and_bad_http_options_are_refused():
    with pytest.raises(ValueError, match="unknown publisher 'kafka'"):
        get_publisher("kafka")
    with pytest.raises(ValueError, match="'url' must be an http"):
        get_publisher("http", {"url": "ftp://x"})
    with pytest.raises(ValueError, match=r"not a notifications_retry\.outbox\.publishers\.Publisher"):
        get_publisher("tests.factories.ChannelFactory")


def test_http_publisher_retries_with_backoff_then_reports_the_endpoint_down(webhook_server):
    webhook_server.responder = lambda request: Reply(503, headers={"Retry-After": "2"})
    sleeps: list[float] = []
    publisher = HttpPublisher(
        {"url": webhook_server.url, "retries": 3, "backoff_seconds": 0.5, "backoff_cap_seconds": 1.5},
        sleep=sleeps.append,
    )
    event = {"event_id": "e", "key": "k", "topic": "t", "generation": 0}
    with pytest.raises(Exception, match="unavailable after 4 attempt") as info:
        publisher.publish(event)
    assert info.value.endpoint_down
    assert len(webhook_server.requests) == 4
    # Exponential from 0.5 s, raised to Retry-After (2 s), capped at 1.5 s.
    assert sleeps == [1.5, 1.5, 1.5]
    publisher.close()


def test_http_publisher_reads_retry_after_as_providers_do_an_http_date_too(webhook_server):
    in_a_while = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    webhook_server.responder = lambda request: Reply(503, headers={"Retry-After": in_a_while})
    sleeps: list[float] = []
    publisher = HttpPublisher(
        {"url": webhook_server.url, "retries": 1, "backoff_seconds": 0.1, "backoff_cap_seconds": 5},
        sleep=sleeps.append,
    )
    with pytest.raises(Exception, match="unavailable after 2 attempt"):
        publisher.publish({"event_id": "e", "key": "k", "topic": "t", "generation": 0})
    # The date is 30 s away: the wait is raised to it, then capped (it was ignored: 0.1 s).
    assert sleeps == [5]
    publisher.close()


def test_http_publisher_does_not_repeat_a_refusal(webhook_server):
    webhook_server.responder = lambda request: Reply(400)
    publisher = HttpPublisher({"url": webhook_server.url, "retries": 3}, sleep=lambda s: None)
    with pytest.raises(Exception, match="refused event e: HTTP 400") as info:
        publisher.publish({"event_id": "e", "key": "k", "topic": "t", "generation": 0})
    assert not info.value.endpoint_down
    assert len(webhook_server.requests) == 1
    publisher.close()


# --- failures keep order and lose nothing -------------------------------------------------------------


@pytest.mark.django_db
def test_a_key_that_fails_holds_back_only_its_own_later_events(clock, webhook_server):
    keys = make_events(clock, keys=3)
    victim = keys[1]
    refusing = {"on": True}
    webhook_server.responder = lambda r: Reply(400 if refusing["on"] and r.json()["key"] == victim else 200)
    report = http_relay(webhook_server, clock).batch()
    assert report.blocked_keys == [victim] and report.failed == 1 and not report.endpoint_down
    tried = [r.json() for r in webhook_server.requests]
    # The victim's generation 0 was tried once; its generation 1 was not even tried.
    assert [(b["key"], b["generation"]) for b in tried if b["key"] == victim] == [(victim, 0)]
    assert set(Outbox.objects.filter(published_at__isnull=True).values_list("key", flat=True)) == {victim}
    assert Outbox.objects.filter(published_at__isnull=False).count() == 4

    refusing["on"] = False
    report = http_relay(webhook_server, clock).batch()
    assert report.published == 2
    later = [(b["key"], b["generation"]) for b in (r.json() for r in webhook_server.requests[len(tried) :])]
    assert later == [(victim, 0), (victim, 1)]
    assert not Outbox.objects.filter(published_at__isnull=True).exists()


@pytest.mark.django_db
def test_endpoint_down_stops_the_batch_and_nothing_is_marked(clock, webhook_server):
    make_events(clock, keys=4)
    webhook_server.responder = lambda r: Reply(503)
    relay = http_relay(webhook_server, clock)
    for _ in range(3):
        report = relay.batch()
        assert report.endpoint_down and report.published == 0
    # One event per batch was tried (with its retry); none of the others was attempted.
    first = Outbox.objects.order_by("id").first()
    assert {r.json()["event_id"] for r in webhook_server.requests} == {str(first.event_id)}
    assert len(webhook_server.requests) == 3 * 2
    assert not Outbox.objects.filter(published_at__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_endpoint_down_for_a_while_then_back_loses_and_reorders_nothing(clock):
    statuses: dict[int, int] = {}
    back_at: list[float] = []  # the endpoint is down for 1 s from the first request it gets
    counter = {"n": 0}
    lock = threading.Lock()

    def responder(request: RecordedRequest) -> Reply:
        with lock:
            if not back_at:
                back_at.append(time.monotonic() + 1.0)
            index = counter["n"]
            counter["n"] += 1
            statuses[index] = 503 if time.monotonic() < back_at[0] else 200
            return Reply(statuses[index])

    server = ScriptedServer(responder).start()
    try:
        make_events(clock, keys=8, generations=3)
        relay = Relay(
            HttpPublisher({"url": server.url, "retries": 2, "backoff_seconds": 0.05}),
            clock=clock,
            batch_size=5,
            interval=0.05,
            max_backoff=0.2,
        )

        def run() -> None:
            try:
                relay.run()
            finally:
                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 20
        while Outbox.objects.filter(published_at__isnull=True).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        relay.stop()
        thread.join(10)
        assert not thread.is_alive()
        assert any(s == 503 for s in statuses.values()), "the endpoint was never down"
        bodies = accepted(server, statuses)
        ids = [b["event_id"] for b in bodies]
        assert len(ids) == len(set(ids)) == 24  # every event accepted, exactly once
        assert not Outbox.objects.filter(published_at__isnull=True).exists()
        assert_order_per_key(bodies)
        # While down, the relay retried with growing pauses instead of hammering the endpoint.
        failed = sum(1 for s in statuses.values() if s == 503)
        assert failed < 60
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_concurrent_relays_share_the_work_without_duplicates_or_reordering(clock):
    server = ScriptedServer(lambda r: Reply(200, delay=0.002)).start()
    try:
        make_events(clock, keys=20, generations=3)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                relay = Relay(HttpPublisher({"url": server.url}), clock=clock, batch_size=7, interval=0.01)
                for _ in range(50):
                    relay.batch()
                    if not Outbox.objects.filter(published_at__isnull=True).exists():
                        break
                relay.locks.close()
                relay.publisher.close()
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert_everything_published_once_each(server)
        # Per key, receipt order is creation order even counting every request.
        per_key = defaultdict(list)
        for request in server.requests:
            per_key[request.json()["key"]].append(request.json()["generation"])
        assert all(g == [0, 1, 2] for g in per_key.values())
    finally:
        server.stop()


# --- a crash re-publishes, never skips ----------------------------------------------------------------


def _relay_process(url: str, *args: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "NR_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
        "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "django", "outbox_relay", "--publisher", "http", "--url", url, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_a_relay_killed_mid_publish_republishes_and_never_skips(clock):
    hang_at = 8  # the 8th request never gets an answer: the relay is killed while waiting for it
    arrived = threading.Event()

    def responder(request: RecordedRequest) -> Reply:
        with server.lock:
            index = len(server.requests)
        if index == hang_at:
            arrived.set()
            return Reply(hang=True)
        return Reply(200)

    server = ScriptedServer(responder).start()
    try:
        make_events(clock, keys=6, generations=2)
        process = _relay_process(server.url, "--batch-size", "5", "--interval", "0.05")
        try:
            assert arrived.wait(30), process.stderr.read1().decode() if process.stderr else ""
            process.send_signal(signal.SIGKILL)
            process.wait(10)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == -signal.SIGKILL
        before_crash = [r.json()["event_id"] for r in server.requests]
        marked = {
            str(e)
            for e in Outbox.objects.filter(published_at__isnull=False).values_list("event_id", flat=True)
        }
        # The first batch (5 events) was accepted and marked; the second was cut short.
        assert marked == set(before_crash[:5])
        unmarked_but_sent = set(before_crash[5:])
        assert len(unmarked_but_sent) == 3

        server.responder = lambda request: Reply(200)
        restarted = _relay_process(server.url, "--batch-size", "5", "--once")
        _out, err = restarted.communicate(timeout=60)
        assert restarted.returncode == 0, err.decode()

        after_crash = [r.json()["event_id"] for r in server.requests[len(before_crash) :]]
        # At least once: what was sent but not marked goes out again; what was marked does not.
        assert unmarked_but_sent <= set(after_crash)
        assert not marked & set(after_crash)
        # Never skips: every event reached the endpoint and is marked published now.
        everything = {str(e) for e in Outbox.objects.values_list("event_id", flat=True)}
        assert set(before_crash) | set(after_crash) == everything
        assert not Outbox.objects.filter(published_at__isnull=True).exists()
        assert_order_per_key([r.json() for r in server.requests])
        assert_order_per_key([r.json() for r in server.requests[len(before_crash) :]])
    finally:
        server.stop()


# --- the command --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_relays_take_is_bounded_as_the_workers_transactions_are(clock):
    """The take locks its events (FOR UPDATE): a transaction a partition strands there must be one the
    server ends after the bound, so its first statement sets the bound."""
    from django.test.utils import CaptureQueriesContext

    make_events(clock, keys=1)
    relay = Relay(LogPublisher(), clock=clock, batch_size=10)
    with CaptureQueriesContext(connection) as captured:
        relay.run(once=True)
    statements = [q["sql"] for q in captured.captured_queries]
    locking = next(i for i, sql in enumerate(statements) if "FOR UPDATE" in sql)
    assert "idle_in_transaction_session_timeout" in statements[locking - 1], statements[: locking + 1]
    assert "statement_timeout" in statements[locking - 1]
