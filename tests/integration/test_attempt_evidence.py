"""Evidence per attempt (SPEC §5): each provider call's attempt_log entry keeps the answer and the trigger."""

from __future__ import annotations

import random
import socket
from datetime import timedelta

import pytest

from notifications_retry import api
from notifications_retry.delivery.triage import requeue
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from notifications_retry.observability.excerpts import excerpt
from notifications_retry.rules.outcomes import EXCERPT_BYTES, answer_text
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
SECRET = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"  # base64 of 24 bytes


def tick(clock) -> None:
    Worker(clock=clock, rng=random.Random(7)).tick()


def webhook_channel(server, **options):
    return ChannelFactory(
        key="hooks",
        provider_key="webhook",
        max_attempts=3,
        timeout_seconds=2,
        options={"url": server.url, **options},
    )


def due(clock, channel, **fields):
    fields.setdefault("status", Status.FAILED)
    fields.setdefault("attempts", 0)
    fields.setdefault("next_attempt_at", clock.now() - timedelta(seconds=1))
    return NotificationFactory(channel=channel, **fields)


def test_a_refused_answer_keeps_its_status_masked_excerpt_address_and_trigger(clock, webhook_server):
    recipient = "alice.liddell@example.com"
    echo = (
        f'{{"error": "unauthorized", "to": "{recipient}", "seen_secret": "{SECRET}", '
        f'"token": "Bearer abcdefghijklmnopqrstuvwxyz123456", "pad": "{"x" * 3000}"}}'
    )
    webhook_server.responder = lambda request: Reply(401, echo)
    row = due(clock, webhook_channel(webhook_server, secret=SECRET), recipient=recipient)
    tick(clock)
    row.refresh_from_db()
    (entry,) = row.attempt_log
    assert (
        entry["status_code"] == 401 and entry["outcome"] == "terminal" and entry["error_kind"] == "http_4xx"
    )
    assert entry["remote_addr"] == "127.0.0.1"
    assert entry["trigger"] == "scheduled"
    assert entry["duration_ms"] >= 0
    text = entry["response_excerpt"]
    assert text.startswith('{"error": "unauthorized"')
    assert len(text.encode()) <= EXCERPT_BYTES
    assert recipient not in text and SECRET not in text and "abcdefghijklmnopqrstuvwxyz" not in text


def test_a_delivery_keeps_status_and_address_but_no_body(clock, webhook_server):
    webhook_server.responder = lambda request: Reply(202, {"id": "prov-7"})
    row = due(clock, webhook_channel(webhook_server))
    tick(clock)
    row.refresh_from_db()
    (entry,) = row.attempt_log
    assert row.status == Status.SENT
    assert (entry["status_code"], entry["remote_addr"], entry["response_excerpt"]) == (202, "127.0.0.1", "")
    assert entry["trigger"] == "scheduled"


def test_no_answer_has_a_null_status(clock, settings):
    from tests.conftest import allow_loopback

    allow_loopback(settings)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    channel = ChannelFactory(
        key="hooks", provider_key="webhook", max_attempts=3, options={"url": f"http://127.0.0.1:{port}/x"}
    )
    row = due(clock, channel)
    tick(clock)
    row.refresh_from_db()
    (entry,) = row.attempt_log
    assert (
        entry["status_code"] is None
        and entry["response_excerpt"] == ""
        and entry["error_kind"] == "connection"
    )
    assert entry["trigger"] == "scheduled"


def test_an_outcome_decided_without_a_call_has_no_answer_fields(clock):
    channel = ChannelFactory(key="in_app", max_attempts=3)
    row = due(clock, channel, expires_at=clock.now() - timedelta(seconds=5))
    tick(clock)
    row.refresh_from_db()
    (entry,) = row.attempt_log
    assert entry["error_kind"] == "expired" and "status_code" not in entry and entry["trigger"] == "scheduled"


@pytest.mark.parametrize("trigger", ["manual", "replay"])
def test_the_first_attempt_after_a_requeue_names_who_requeued(clock, webhook_server, trigger):
    answers = iter([Reply(500, "down"), Reply(500, "still down"), Reply(500, "again")])
    webhook_server.responder = lambda request: next(answers)
    channel = webhook_channel(webhook_server)
    row = due(clock, channel, attempts=2)  # the next failure is its last attempt: a dead letter
    tick(clock)
    row.refresh_from_db()
    assert row.dead_lettered_at is not None
    assert requeue([row.pk], actor="ops", reason="partner fixed", now=clock.now(), trigger=trigger).done
    tick(clock)
    row.refresh_from_db()
    clock.advance(7200)
    tick(clock)
    row.refresh_from_db()
    assert [e["trigger"] for e in row.attempt_log] == ["scheduled", trigger, "scheduled"]
    assert [e["status_code"] for e in row.attempt_log] == [500, 500, 500]
    assert [e["response_excerpt"] for e in row.attempt_log] == ["down", "still down", "again"]
    assert row.next_trigger is None


def test_a_requeue_refuses_an_unknown_trigger(clock):
    with pytest.raises(ValueError, match="manual"):
        requeue([], actor="ops", trigger="scheduled")


def test_the_monolith_handing_over_is_a_handoff(clock):
    channel = ChannelFactory(key="in_app")
    row = NotificationFactory(channel=channel, status=Status.PENDING)
    api.record_dispatch_failure(row, error="smtp down", now=clock.now(), rng=random.Random(1))
    row.refresh_from_db()
    (entry,) = row.attempt_log
    assert entry["trigger"] == "handoff" and "status_code" not in entry


@pytest.mark.django_db(transaction=True)
def test_send_now_records_the_answer_as_a_handoff(webhook_server):
    webhook_server.responder = lambda request: Reply(410, "gone for good")
    row = NotificationFactory(channel=webhook_channel(webhook_server), status=Status.PENDING)
    api.send_now(row, rng=random.Random(1))
    row.refresh_from_db()
    (entry,) = row.attempt_log
    assert (entry["trigger"], entry["status_code"], entry["response_excerpt"]) == (
        "handoff",
        410,
        "gone for good",
    )
    assert entry["remote_addr"] == "127.0.0.1" and entry["duration_ms"] > 0


def test_excerpt_cuts_at_a_character_boundary_and_masks_payload_texts():
    text = excerpt(answer_text(("é" * 2000).encode()))
    assert len(text.encode()) <= EXCERPT_BYTES and set(text) == {"é"}
    assert excerpt("your code 4242-secret-text here", payload={"code": "4242-secret-text"}) == (
        "your code *** here"
    )
    assert excerpt("") == "" and answer_text(None) == "" and answer_text(b"") == ""
    assert answer_text(b"echo: s3cr3t-value", secrets=["s3cr3t-value"]) == "echo: ***"


def test_a_recovery_jobs_requeue_is_a_replay(clock, webhook_server):
    from notifications_retry.delivery import recovery
    from notifications_retry.delivery.recovery_filter import recovery_filter

    webhook_server.responder = lambda request: Reply(500, "down")
    channel = webhook_channel(webhook_server)
    row = due(clock, channel, attempts=2)
    tick(clock)
    row.refresh_from_db()
    window = recovery_filter(
        channel="hooks", since=clock.now() - timedelta(hours=1), until=clock.now() + timedelta(hours=1)
    )
    clock.advance(1)  # a job takes the rows dead-lettered before its creation
    job = recovery.start_job(window, actor="ops", clock=clock)
    recovery.begin(job.pk, clock=clock)
    recovery.run_chunk(job.pk, clock=clock)
    row.refresh_from_db()
    assert row.next_trigger == "replay"
    tick(clock)
    row.refresh_from_db()
    assert [e["trigger"] for e in row.attempt_log] == ["scheduled", "replay"]
