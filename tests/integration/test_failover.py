"""Provider failover with two real local receivers on 127.0.0.1.

The primary's provider refusing an attempt unambiguously (a closed port, 503, 429) sends the same
attempt to the fallback channel's provider; an ambiguous failure (the request was read, no answer)
never does; the fallback failing too leaves the primary's own decision.
"""

from __future__ import annotations

import random
import socket
import time
from datetime import timedelta

import jsonschema
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from notifications_retry.delivery import events
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer
from tests.support.mailers import mailer_options_for
from tests.support.smtp_server import ScriptedSMTPServer

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
VALIDATOR = jsonschema.Draft202012Validator(events.schema(), format_checker=jsonschema.FormatChecker())


@pytest.fixture(autouse=True)
def loopback_webhooks(settings):
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}


@pytest.fixture
def fallback_server():
    server = ScriptedServer(lambda request: Reply(200, {"id": "fb-1"})).start()
    yield server
    server.stop()


@pytest.fixture
def make_worker(clock):
    workers: list[Worker] = []

    def make() -> Worker:
        workers.append(Worker(clock=clock, rng=random.Random(7), batch_size=100))
        return workers[-1]

    yield make
    for worker in workers:
        worker.close()


def closed_port_url() -> str:
    """A loopback URL nothing listens on: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def channels(primary_url: str, fallback_url: str, fallback_concurrency: int = 2, **primary):
    fallback = ChannelFactory(
        key="sms-backup",
        provider_key="webhook",
        options={"url": fallback_url},
        max_concurrency=fallback_concurrency,
    )
    values = dict(
        key="sms",
        provider_key="webhook",
        options={"url": primary_url},
        max_concurrency=1,
        max_attempts=3,
        timeout_seconds=5.0,
        fallback=fallback,
    )
    values.update(primary)
    return ChannelFactory(**values), fallback


def due(clock, channel, count=1, **fields):
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=fields.pop("attempts", 1),
            next_attempt_at=clock.now() - timedelta(seconds=30 - i * 0.001),
            **fields,
        )
        for i in range(count)
    ]


def event_of(record) -> dict:
    event = Outbox.objects.get(key=str(record.id))
    VALIDATOR.validate(events.envelope(event))
    return dict(event.payload)


def failovers(channel: str, fallback: str, outcome: str) -> float:
    labels = {"channel": channel, "fallback": fallback, "outcome": outcome}
    return REGISTRY.get_sample_value("notifications_retry_failovers_total", labels) or 0.0


def test_primary_down_the_fallback_delivers_once_and_the_event_says_so(clock, fallback_server, make_worker):
    primary, _ = channels(closed_port_url(), fallback_server.url)
    (record,) = due(clock, primary)
    before = failovers("sms", "sms-backup", "sent")
    with capture_logs() as logs:
        stats = make_worker().tick()
    assert stats.sent == 1
    assert fallback_server.keys() == [str(record.id)]  # once, with the same idempotency key
    assert fallback_server.requests[0].json()["channel"] == "sms-backup"
    record.refresh_from_db()
    assert (record.status, record.provider_message_id, record.attempts) == (Status.SENT, "fb-1", 2)
    assert record.attempt_log[-1]["delivered_by"] == "sms-backup"
    payload = event_of(record)
    assert (payload["status"], payload["channel"], payload["delivered_by"]) == ("Sent", "sms", "sms-backup")
    assert failovers("sms", "sms-backup", "sent") == before + 1
    (line,) = [e for e in logs if e["event"] == "item-failed-over"]
    assert (line["channel"], line["fallback"], line["reason"], line["delivered"]) == (
        "sms",
        "sms-backup",
        "connection",
        True,
    )
    assert any(e["event"] == "item-sent" and e.get("delivered_by") == "sms-backup" for e in logs)


@pytest.mark.parametrize("refusal", [Reply(503, "down"), Reply(429, headers={"Retry-After": "1"})])
def test_503_or_429_answered_before_processing_goes_to_the_fallback(
    clock, webhook_server, fallback_server, make_worker, refusal
):
    webhook_server.responder = lambda request: refusal
    primary, _ = channels(webhook_server.url, fallback_server.url)
    (record,) = due(clock, primary)
    assert make_worker().tick().sent == 1
    assert webhook_server.keys() == [str(record.id)] and fallback_server.keys() == [str(record.id)]
    assert event_of(record)["delivered_by"] == "sms-backup"


def test_a_channel_paused_by_retry_after_sends_its_other_records_through_the_fallback(
    clock, webhook_server, fallback_server, make_worker
):
    webhook_server.responder = lambda request: Reply(429, headers={"Retry-After": "30"})
    primary, _ = channels(webhook_server.url, fallback_server.url)
    records = due(clock, primary, 4)
    with capture_logs() as logs:
        assert make_worker().tick().sent == 4
    assert len(webhook_server.requests) == 1  # paused after its first answer: not called again
    assert sorted(fallback_server.keys()) == sorted(str(r.id) for r in records)
    assert sorted(e["reason"] for e in logs if e["event"] == "item-failed-over") == ["throttled"] * 4


def test_an_smtp_4xx_to_mail_from_fails_over_from_email_to_a_webhook(
    clock, fallback_server, make_worker, settings
):
    smtp = ScriptedSMTPServer().start()
    try:
        options = mailer_options_for(settings)(
            "django.core.mail.backends.smtp.EmailBackend", smtp.backend_options()
        )
        primary, _ = channels("", fallback_server.url, provider_key="django_email", options=options)
        payload = {"subject": "Your order", "body": "It shipped.", "from": "mail451@example.com"}
        (record,) = due(clock, primary, recipient="ann@example.com", payload=payload)
        assert make_worker().tick().sent == 1
    finally:
        smtp.stop()
    assert fallback_server.keys() == [str(record.id)]
    assert event_of(record)["delivered_by"] == "sms-backup"


def test_a_timeout_after_the_request_was_read_never_fails_over(
    clock, webhook_server, fallback_server, make_worker
):
    webhook_server.responder = lambda request: Reply(hang=True)
    primary, _ = channels(webhook_server.url, fallback_server.url, timeout_seconds=1.0)
    (record,) = due(clock, primary)
    stats = make_worker().tick()
    assert (stats.sent, stats.retried) == (0, 1)
    assert len(webhook_server.requests) == 1
    assert fallback_server.requests == []  # the message may be out: a second provider would duplicate it
    record.refresh_from_db()
    assert (record.status, record.error_kind, record.attempts) == (Status.FAILED, "timeout", 2)
    assert record.dead_lettered_at is None and record.next_attempt_at > clock.now()
    assert not Outbox.objects.filter(key=str(record.id)).exists()


def test_an_ambiguous_5xx_does_not_fail_over(clock, webhook_server, fallback_server, make_worker):
    webhook_server.responder = lambda request: Reply(500)
    primary, _ = channels(webhook_server.url, fallback_server.url)
    due(clock, primary)
    assert make_worker().tick().retried == 1
    assert fallback_server.requests == []


def test_fallback_failing_too_leaves_the_primarys_retry(clock, webhook_server, fallback_server, make_worker):
    webhook_server.responder = lambda request: Reply(503)
    fallback_server.responder = lambda request: Reply(500, "broken too")
    primary, _ = channels(
        webhook_server.url, fallback_server.url, backoff_base_seconds=7, backoff_cap_seconds=7
    )
    (record,) = due(clock, primary)
    before = failovers("sms", "sms-backup", "failed")
    stats = make_worker().tick()
    assert (stats.sent, stats.retried) == (0, 1)
    assert len(fallback_server.requests) == 1
    record.refresh_from_db()
    # The primary's decision: its error kind, its backoff (7 s, jitter aside), not the fallback's.
    assert (record.status, record.error_kind) == (Status.FAILED, "http_5xx")
    assert "fallback sms-backup failed too" in record.last_error
    assert timedelta(seconds=5) <= record.next_attempt_at - clock.now() <= timedelta(seconds=9)
    assert failovers("sms", "sms-backup", "failed") == before + 1


def test_fallback_failing_on_the_last_attempt_is_the_primarys_terminal(
    clock, webhook_server, fallback_server, make_worker
):
    webhook_server.responder = lambda request: Reply(503)
    fallback_server.responder = lambda request: Reply(500)
    primary, _ = channels(webhook_server.url, fallback_server.url, max_attempts=2)
    (record,) = due(clock, primary, attempts=1)
    assert make_worker().tick().terminal == 1
    assert len(fallback_server.requests) == 1
    record.refresh_from_db()
    assert record.dead_lettered_at is not None and record.error_kind == "http_5xx"
    payload = event_of(record)
    assert payload["status"] == "Failed" and "delivered_by" not in payload


def test_an_open_circuit_sends_the_channels_records_through_the_fallback(
    clock, settings, webhook_server, fallback_server, make_worker
):
    settings.NOTIFICATIONS_RETRY = {
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        "CIRCUIT_BREAKER": {"failure_threshold": 2, "cooldown_seconds": 60.0},
    }
    webhook_server.responder = lambda request: Reply(503)
    primary, _ = channels(webhook_server.url, fallback_server.url)
    records = due(clock, primary, 6)
    with capture_logs() as logs:
        stats = make_worker().tick()
    assert stats.sent == 6
    # Two refusals open the primary's circuit; after that it is not called at all.
    assert len(webhook_server.requests) == 2
    assert sorted(fallback_server.keys()) == sorted(str(r.id) for r in records)
    reasons = [e["reason"] for e in logs if e["event"] == "item-failed-over"]
    assert reasons.count("http_5xx") == 2 and reasons.count("circuit_open") == 4
    assert all(event_of(r)["delivered_by"] == "sms-backup" for r in records)


def test_no_failover_into_the_fallbacks_open_circuit(
    clock, settings, webhook_server, fallback_server, make_worker
):
    settings.NOTIFICATIONS_RETRY = {
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        "CIRCUIT_BREAKER": {"failure_threshold": 2, "cooldown_seconds": 60.0},
    }
    webhook_server.responder = lambda request: Reply(503)
    fallback_server.responder = lambda request: Reply(500)
    # One slot on the fallback: no record routed around the primary's open circuit can reach it
    # while the second failover (the one that opens its circuit) is in flight.
    primary, _ = channels(webhook_server.url, fallback_server.url, fallback_concurrency=1)
    records = due(clock, primary, 5)
    worker = make_worker()
    stats = worker.tick()
    # Both circuits open after two calls each; the other records are given back untouched.
    assert (len(webhook_server.requests), len(fallback_server.requests)) == (2, 2)
    assert stats.retried == 2 and stats.sent == 0
    untouched = NotificationEntity.objects.filter(pk__in=[r.pk for r in records], attempts=1)
    assert untouched.count() == 3 and not untouched.filter(claim_token__isnull=False).exists()
    assert worker.tick().processed == 0  # both circuits still open: nothing is called
    assert (len(webhook_server.requests), len(fallback_server.requests)) == (2, 2)


def test_a_disabled_fallback_is_not_used(clock, fallback_server, make_worker):
    primary, fallback = channels(closed_port_url(), fallback_server.url)
    type(fallback).objects.filter(pk=fallback.pk).update(is_enabled=False)  # past validation
    due(clock, primary)
    with capture_logs() as logs:
        assert make_worker().tick().retried == 1
    assert fallback_server.requests == []
    assert any(e["event"] == "channel-fallback-unusable" and e["reason"] == "disabled" for e in logs)


def test_an_in_app_fallback_delivers_when_the_webhook_is_down(clock, make_worker):
    inbox = ChannelFactory(key="inbox", provider_key="in_app")
    primary = ChannelFactory(
        key="push", provider_key="webhook", options={"url": closed_port_url()}, max_attempts=3, fallback=inbox
    )
    (record,) = due(clock, primary)
    assert make_worker().tick().sent == 1
    record.refresh_from_db()
    assert (record.status, record.provider_message_id) == (Status.SENT, f"in_app:{record.id}")
    assert event_of(record)["delivered_by"] == "inbox"


def test_after_the_cool_down_one_probe_goes_to_the_primary_and_closes_its_circuit(
    clock, settings, webhook_server, fallback_server, make_worker
):
    settings.NOTIFICATIONS_RETRY = {
        "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"],
        "CIRCUIT_BREAKER": {"failure_threshold": 1, "cooldown_seconds": 1.0},
    }
    down = {"on": True}
    webhook_server.responder = lambda request: Reply(503) if down["on"] else Reply(200, {"id": "own"})
    primary, _ = channels(webhook_server.url, fallback_server.url)
    due(clock, primary, 3)
    worker = make_worker()
    assert worker.tick().sent == 3
    assert (len(webhook_server.requests), len(fallback_server.requests)) == (1, 3)

    down["on"] = False
    later = due(clock, primary, 3)
    time.sleep(1.05)
    with capture_logs() as logs:
        assert worker.tick().sent == 3
    assert [e["event"] for e in logs if e["event"].startswith("circuit-")][:2] == [
        "circuit-half-open",
        "circuit-closed",
    ]
    # The probe went to the primary and closed its circuit. (Records claimed while the probe was out
    # went through the fallback meanwhile: how many depends on the probe's speed.)
    assert len(webhook_server.requests) >= 2
    assert len(webhook_server.requests) + len(fallback_server.requests) == 1 + 3 + 3
    own = 0
    for record in later:
        record.refresh_from_db()
        by = event_of(record).get("delivered_by")
        assert (record.provider_message_id, by) in (("own", None), ("fb-1", "sms-backup"))
        own += record.provider_message_id == "own"
    assert own == len(webhook_server.requests) - 1
