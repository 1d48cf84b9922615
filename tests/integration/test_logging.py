"""Canary recipients, tokens and bodies never reach log output; the SPEC's events carry their context.

structlog is configured here the way docs/observability.md tells a project to (stdlib integration,
``notifications_retry.observability.logging.processors()`` in both chains, JSON and console
renderers), and every byte the handlers write is searched.
"""

from __future__ import annotations

import io
import json
import logging
import random
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import structlog
from django.test import override_settings

import notifications_retry.observability.logging as nr_logging
from notifications_retry.engine.worker import Worker
from notifications_retry.exceptions import PermanentProviderError, RetryableProviderError
from notifications_retry.models import NotificationEntity
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult
from tests.factories import ChannelFactory, NotificationFactory

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status

CANARY_EMAIL = "canary.person@leak-test.example"
CANARY_PHONE = "+44 7700 900123"
CANARY_DEVICE_TOKEN = "devtokCANARY9f8e7d6c5b4a3z"
CANARY_BODY = "CANARY-BODY the secret code is 424242"
CANARY_SUBJECT = "CANARY-SUBJECT reset your password"
CANARY_API_TOKEN = "tok_CANARY_abcdef123456"
# Pieces a partial mask could still leak.
FORBIDDEN = [
    CANARY_EMAIL,
    "canary.person",
    "leak-test",
    CANARY_PHONE,
    "7700 900123",
    "7700900123",
    "900123",
    CANARY_DEVICE_TOKEN,
    "9f8e7d6c5b4a3z",
    CANARY_BODY,
    "424242",
    CANARY_SUBJECT,
    "reset your password",
    CANARY_API_TOKEN,
    "abcdef123456",
]

stdlib_log = logging.getLogger("tests.canary_provider")
struct_log = structlog.get_logger("tests.canary_provider")


class CanaryProvider(Provider):
    """A careless provider: logs everything it holds and puts the recipient and body in its errors."""

    key: ClassVar[str] = "canary"
    inline: ClassVar[bool] = True

    def send(self, message: OutgoingMessage) -> SendResult:
        struct_log.info(
            "provider-request",
            message=message,
            recipient=message.recipient,
            payload=message.payload,
            headers={"Authorization": f"Bearer {CANARY_API_TOKEN}"},
            url=f"https://api.example.test/send?token={CANARY_API_TOKEN}&to={message.recipient}",
        )
        stdlib_log.warning("calling gateway for %s with api key=%s", message.recipient, CANARY_API_TOKEN)
        mode = message.payload.get("mode")
        if mode == "crash":
            try:
                raise ValueError(f"gateway refused {message.recipient}")
            except ValueError:
                struct_log.exception("provider-crashed")
                stdlib_log.exception("gateway crash for %s", message.recipient)
            raise RuntimeError(f"cannot render {message.payload['body']} for {message.recipient}")
        if mode == "retry":
            raise RetryableProviderError(f"{message.recipient} temporarily unreachable", kind="unreachable")
        raise PermanentProviderError(
            f"invalid recipient {message.recipient}; body was {message.payload['body']}",
            kind="invalid_recipient",
        )


def _configure(stream_json: io.StringIO, stream_console: io.StringIO) -> list[logging.Handler]:
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        *nr_logging.processors(),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handlers: list[logging.Handler] = []
    for stream, renderer in (
        (stream_json, structlog.processors.JSONRenderer()),
        (stream_console, structlog.dev.ConsoleRenderer(colors=False)),
    ):
        handler = logging.StreamHandler(stream)
        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    renderer,
                ],
                foreign_pre_chain=shared,
            )
        )
        handlers.append(handler)
    return handlers


@pytest.fixture
def captured() -> Iterator[dict[str, io.StringIO]]:
    streams = {"json": io.StringIO(), "console": io.StringIO()}
    handlers = _configure(streams["json"], streams["console"])
    root = logging.getLogger()
    old_level = root.level
    root.setLevel(logging.DEBUG)
    for handler in handlers:
        root.addHandler(handler)
    try:
        yield streams
    finally:
        for handler in handlers:
            root.removeHandler(handler)
        root.setLevel(old_level)
        structlog.reset_defaults()


def subset(event: dict[str, Any], **expected: Any) -> dict[str, Any]:
    """``expected`` when the event holds it (compared as dicts, so a failure shows the difference)."""
    assert {k: event.get(k) for k in expected} == expected
    return expected


def _events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


@override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"canary": f"{__name__}.CanaryProvider"}})
def test_canaries_never_reach_any_log_output(clock, captured, caplog):
    caplog.set_level(logging.DEBUG)
    due = clock.now() - timedelta(seconds=5)
    channels = {
        "email": ChannelFactory(key="email", provider_key="canary", max_attempts=5),
        "sms": ChannelFactory(key="sms", provider_key="canary", max_attempts=5),
        "push": ChannelFactory(key="push", provider_key="canary", max_attempts=5),
    }
    payload = {"subject": CANARY_SUBJECT, "body": CANARY_BODY}
    rows = [
        NotificationFactory(
            channel=channels["email"],
            recipient=CANARY_EMAIL,
            payload=payload,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=due,
        ),
        NotificationFactory(
            channel=channels["sms"],
            recipient=CANARY_PHONE,
            payload={**payload, "mode": "retry"},
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=due,
        ),
        NotificationFactory(
            channel=channels["push"],
            recipient=CANARY_DEVICE_TOKEN,
            payload={**payload, "mode": "crash"},
            status=Status.FAILED,
            attempts=4,
            next_attempt_at=due,
        ),
    ]
    worker = Worker(clock=clock, rng=random.Random(3))
    stats = worker.tick()
    worker.close()
    assert (stats.terminal, stats.retried) == (2, 1)

    # pytest's own capture handler formats foreign stdlib records without the project's chain; the
    # records structlog produced reach it already masked.
    structlog_records = "\n".join(str(r.msg) for r in caplog.records if isinstance(r.msg, dict))
    outputs = {
        "json": captured["json"].getvalue(),
        "console": captured["console"].getvalue(),
        "structlog records seen by other handlers": structlog_records,
    }
    for name, text in outputs.items():
        leaked = [canary for canary in FORBIDDEN if canary in text]
        assert not leaked, f"{name} log output leaks {leaked}:\n{text}"

    # Not vacuous: the careless provider's logs and the worker's events are all there, ids readable.
    events = _events(captured["json"])
    names = [e["event"] for e in events]
    for expected in (
        "retry-cycle-started",
        "provider-request",
        "provider-crashed",
        "item-retried",
        "item-failed-terminal",
        "cycle-completed",
    ):
        assert expected in names
    assert any(n.startswith("calling gateway for") for n in names)
    assert any(e["event"].startswith("gateway crash for") and "exception" in e for e in events)
    terminal = {e["notification_id"]: e for e in events if e["event"] == "item-failed-terminal"}
    assert set(terminal) == {str(rows[0].id), str(rows[2].id)}
    assert terminal[str(rows[0].id)]["error"] == "invalid recipient c***@l***.example; body was ***"
    request = next(
        e for e in events if e["event"] == "provider-request" and e["message"]["channel"] == "email"
    )
    assert request["recipient"] == "c***@l***.example"
    assert request["payload"] == "<masked 2 keys>"
    assert request["message"]["recipient"] == "c***@l***.example"
    assert request["headers"] == "<masked 1 keys>"
    assert request["message"]["notification_id"] == str(rows[0].id)


def test_worker_events_carry_the_spec_context(clock, captured):
    in_app = ChannelFactory(key="in_app")
    failing = ChannelFactory(key="email", provider_key="stub", options={"fail": "retriable"}, max_attempts=2)
    disabled = ChannelFactory(key="sms", is_enabled=False)
    due = clock.now() - timedelta(seconds=5)
    sent = NotificationFactory(
        channel=in_app, status=Status.FAILED, attempts=1, next_attempt_at=due, correlation_id="corr-sent"
    )
    retried = NotificationFactory(
        channel=failing, status=Status.PENDING, scheduled_at=due, correlation_id="corr-retry"
    )
    terminal = NotificationFactory(
        channel=failing, status=Status.FAILED, attempts=1, next_attempt_at=due, tenant_id=None
    )
    NotificationFactory(channel=disabled, status=Status.FAILED, attempts=1, next_attempt_at=due)
    worker = Worker(clock=clock, rng=random.Random(3))
    stats = worker.tick()
    worker.close()
    events = _events(captured["json"])
    by_name: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_name.setdefault(event["event"], []).append(event)
        if event["logger"] == "notifications_retry.worker":
            assert event["job_run_id"] == stats.run_id
            assert event["lane"] == "default"

    [started] = by_name["retry-cycle-started"]
    assert started["batch_size"] == 200
    [item_sent] = by_name["item-sent"]
    assert subset(
        item_sent,
        notification_id=str(sent.id),
        channel="in_app",
        outcome="sent",
        tenant_id=str(sent.tenant_id),
        attempt=2,
        correlation_id="corr-sent",
    )
    assert isinstance(item_sent["duration_ms"], float)
    [item_retried] = by_name["item-retried"]
    assert subset(
        item_retried,
        notification_id=str(retried.id),
        channel="email",
        outcome="retry",
        error_kind="stub_retriable",
        attempt=1,
        correlation_id="corr-retry",
    )
    [item_terminal] = by_name["item-failed-terminal"]
    assert subset(
        item_terminal,
        notification_id=str(terminal.id),
        outcome="terminal",
        tenant_id=None,
        attempt=2,
        error="stub told to fail (retriable)",
        level="error",
    )
    [disabled_event] = by_name["channel-disabled"]
    assert subset(disabled_event, channel="sms", due_waiting=1)
    [completed] = by_name["cycle-completed"]
    assert subset(completed, processed=3, sent=1, retried=1, terminal=1, channel_disabled=1)


def test_processors_mask_keys_text_and_nested_values():
    mask = nr_logging.processors()[0]
    event = mask(
        None,
        "info",
        {
            "event": "sent to bob@example.org",
            "recipients": ["+33 6 12 34 56 78", "alice@example.com"],
            "request": {"json": {"to": "x"}, "Authorization": "Basic dXNlcjpwYXNz", "X-Api-Key": "k-123"},
            "url": "https://user:pw@hooks.example/a?sig=abc123&page=2",
            "notification_id": "3f2a6c1e-1234-4567-89ab-1234567890ab",
            "correlation_id": "01HZX3K9YV8M2Q7T4B6N5C1D0E",
            "error": "APNs rejected device 9f8e7d6c5b4a39f8e7d6c5b4a3aa0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8"
            " (job 0123456789abcdef0123456789abcdef)",
            "at": "2026-01-01T12:00:00+00:00",
            "attempt": 3,
            "client_ip": "10.1.2.3",
            "empty_body": "",
        },
    )
    assert event["event"] == "sent to b***@e***.org"
    assert event["recipients"] == ["+*********78", "a***@e***.com"]
    assert event["request"] == {"json": "<masked 1 keys>", "Authorization": "***", "X-Api-Key": "***"}
    assert event["url"] == "https://***@hooks.example/a?sig=***&page=2"
    assert event["notification_id"] == "3f2a6c1e-1234-4567-89ab-1234567890ab"
    assert event["correlation_id"] == "01HZX3K9YV8M2Q7T4B6N5C1D0E"
    assert event["error"] == "APNs rejected device 9f8e***(65) (job 0123456789abcdef0123456789abcdef)"
    assert event["at"] == "2026-01-01T12:00:00+00:00"
    assert event["attempt"] == 3
    assert event["client_ip"] == "10.1.2.3"
    assert event["empty_body"] == ""


def test_redact_cuts_out_known_values_patterns_cannot_see():
    text = "push token devtokABCDEF0123456 rejected while rendering 'Your code is 991' (Hi)"
    assert nr_logging.redact(text, "devtokABCDEF0123456", {"body": "Your code is 991", "greeting": "Hi"}) == (
        "push token devt***(19) rejected while rendering '***' (Hi)"
    )


@override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": {"canary": f"{__name__}.CanaryProvider"}})
def test_worker_process_configuration_writing_events_directly_masks_too(clock):
    """docs/observability.md's configuration for retry_worker processes: structlog writes the lines."""
    stream = io.StringIO()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *nr_logging.processors(),
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.WriteLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
    try:
        channel = ChannelFactory(key="email", provider_key="canary", max_attempts=5)
        row = NotificationFactory(
            channel=channel,
            recipient=CANARY_EMAIL,
            payload={"subject": CANARY_SUBJECT, "body": CANARY_BODY, "mode": "crash"},
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=5),
        )
        worker = Worker(clock=clock, rng=random.Random(3))
        assert worker.tick().retried == 1
        worker.close()
    finally:
        structlog.reset_defaults()
    text = stream.getvalue()
    leaked = [canary for canary in FORBIDDEN if canary in text]
    assert not leaked, f"log output leaks {leaked}:\n{text}"
    events = _events(stream)
    retried = next(e for e in events if e["event"] == "item-retried")
    subset(retried, notification_id=str(row.id), channel="email", level="info", error_kind="provider_crash")
    assert any(e["event"] == "provider-crashed" and "exception" in e for e in events)
