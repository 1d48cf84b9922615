"""OpenTelemetry spans, read back with the SDK's in-memory exporter: tick → record → provider."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from notifications_retry.observability import tracing
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
_EXPORTER: InMemorySpanExporter | None = None


@pytest.fixture
def spans():
    """The finished spans of this test (the global provider can be set only once per process)."""
    global _EXPORTER
    if _EXPORTER is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _EXPORTER = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def due(clock, channel, **kwargs):
    return NotificationFactory(
        channel=channel,
        status=Status.FAILED,
        attempts=1,
        next_attempt_at=clock.now() - timedelta(seconds=5),
        **kwargs,
    )


def by_name(finished, name):
    return [s for s in finished if s.name == name]


def test_inline_provider_tick_record_and_provider_spans_nest(clock, spans):
    channel = ChannelFactory(key="in_app")
    records = [due(clock, channel, correlation_id=f"corr-{i}") for i in range(2)]
    stats = Worker(clock=clock, rng=random.Random(1)).tick()
    finished = spans.get_finished_spans()

    [tick] = by_name(finished, "notifications_retry.tick")
    assert tick.attributes["job_run_id"] == stats.run_id
    assert tick.attributes["lane"] == "default"
    assert tick.attributes["processed"] == 2 and tick.attributes["sent"] == 2

    record_spans = by_name(finished, "notifications_retry.record")
    provider_spans = by_name(finished, "notifications_retry.provider.send")
    assert len(record_spans) == len(provider_spans) == 2
    by_id = {s.attributes["notification.id"]: s for s in record_spans}
    assert set(by_id) == {str(r.id) for r in records}
    for record in records:
        span = by_id[str(record.id)]
        assert span.parent.span_id == tick.context.span_id
        assert span.context.trace_id == tick.context.trace_id
        assert span.attributes["job_run_id"] == stats.run_id
        assert span.attributes["correlation_id"] == record.correlation_id
        assert span.attributes["tenant.id"] == str(record.tenant_id)
        assert span.attributes["notification.channel"] == "in_app"
        assert span.attributes["notification.attempt"] == 2
        assert span.attributes["notification.outcome"] == "sent"
        [provider] = [p for p in provider_spans if p.parent.span_id == span.context.span_id]
        assert provider.attributes["notification.id"] == str(record.id)
        assert provider.attributes["correlation_id"] == record.correlation_id
        assert provider.attributes["job_run_id"] == stats.run_id
        assert provider.attributes["provider.key"] == "in_app"


def test_pooled_http_provider_spans_keep_the_tick_as_parent(clock, spans, webhook_server):
    webhook_server.responder = lambda request: Reply(503, {"error": "maintenance"})
    channel = ChannelFactory(
        key="webhook",
        provider_key="webhook",
        options={"url": webhook_server.url},
        max_attempts=5,
        max_concurrency=2,
    )
    records = [due(clock, channel, correlation_id=f"hook-{i}") for i in range(2)]
    stats = Worker(clock=clock, rng=random.Random(1)).tick()
    assert stats.retried == 2
    assert len(webhook_server.requests) == 2
    finished = spans.get_finished_spans()

    [tick] = by_name(finished, "notifications_retry.tick")
    record_spans = by_name(finished, "notifications_retry.record")
    assert {s.attributes["notification.id"] for s in record_spans} == {str(r.id) for r in records}
    for span in record_spans:
        # The webhook runs in the worker's thread pool: the parent is passed explicitly, not inherited.
        assert span.parent.span_id == tick.context.span_id
        assert span.attributes["notification.outcome"] == "retry"
        assert span.attributes["notification.error_kind"] == "http_5xx"
    provider_spans = by_name(finished, "notifications_retry.provider.send")
    assert {p.parent.span_id for p in provider_spans} == {s.context.span_id for s in record_spans}
    for provider in provider_spans:
        # The HTTP call failed inside the provider span: it is marked as an error with the exception.
        assert provider.status.status_code == StatusCode.ERROR
        assert provider.attributes["provider.key"] == "webhook"
        assert any(e.name == "exception" for e in provider.events)


def test_without_opentelemetry_spans_are_no_ops(clock, spans, monkeypatch):
    monkeypatch.setattr(tracing, "_otel_trace", None)
    monkeypatch.setattr(tracing, "_otel_context", None)
    channel = ChannelFactory(key="in_app")
    due(clock, channel)
    with tracing.span("anything", a=1) as span:
        assert span is None
    tracing.set_attributes(None, a=1)
    assert tracing.current_context() is None
    stats = Worker(clock=clock, rng=random.Random(1)).tick()
    assert stats.sent == 1
    assert spans.get_finished_spans() == ()
