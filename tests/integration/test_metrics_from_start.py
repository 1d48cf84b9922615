"""A worker's per-channel counters exist at 0 from its start, before its first tick, for every channel
configured for its lane (disabled ones too), and a channel added later has them from the next tick.

A series that first appears at N reads as no increase at all to ``increase()``: the first batch of
dead letters after a deploy would not fire an alert. The scrape here is the exporter's text
(``generate_latest``) of the process's registry, read as Prometheus reads it. A worker that serves no
``/metrics`` creates none: nothing would scrape them.
"""

from __future__ import annotations

import uuid

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from notifications_retry.conf import SETTINGS_NAME
from notifications_retry.engine.worker import Worker
from notifications_retry.models import ChannelConfig
from notifications_retry.observability import metrics
from tests.factories import ChannelFactory

pytestmark = pytest.mark.django_db

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape() -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def expected_totals(channel: str) -> list[tuple[str, dict[str, str]]]:
    """Every per-channel ``…_total`` series the worker writes for ``channel``."""
    series = [
        ("notifications_retry_sent_total", {"channel": channel}),
        ("notifications_retry_channel_disabled_total", {"channel": channel}),
    ]
    series += [
        ("notifications_retry_processed_total", {"channel": channel, "outcome": outcome})
        for outcome in metrics.OUTCOMES
    ]
    for kind in metrics.BUILTIN_ERROR_KINDS:
        series.append(("notifications_retry_retried_total", {"channel": channel, "error_kind": kind}))
        series.append(("notifications_retry_terminal_failed_total", {"channel": channel, "error_kind": kind}))
    return series


def missing(samples: Samples, channel: str) -> list[tuple[str, dict[str, str]]]:
    """The series of ``channel`` the scrape does not show at 0."""
    return [
        (name, labels)
        for name, labels in expected_totals(channel)
        if samples.get((name, tuple(sorted(labels.items())))) != 0
    ]


def webhook_with_fallback(key: str, fallback_key: str) -> tuple[ChannelConfig, ChannelConfig]:
    """A webhook channel failing over to an in-app one: their counters and their failover pair's."""
    fallback = ChannelFactory(key=fallback_key, provider_key="in_app")
    hook = ChannelFactory(
        key=key, provider_key="webhook", options={"url": "https://hooks.example.com/in"}, fallback=fallback
    )
    return hook, fallback


def test_every_configured_channel_has_its_counters_at_zero_before_the_first_tick():
    tag = uuid.uuid4().hex[:8]
    hook, fallback = webhook_with_fallback(f"start-hook-{tag}", f"start-inbox-{tag}")
    disabled = ChannelFactory(key=f"start-off-{tag}", provider_key="stub", is_enabled=False)
    broken = ChannelFactory(key=f"start-broken-{tag}", provider_key="webhook", options={})
    other_lane = ChannelFactory(key=f"start-other-{tag}", provider_key="in_app")
    served = [fallback.key, hook.key, disabled.key, broken.key]
    lanes = {"bulk": {"channels": served}, "rest": {"channels": [other_lane.key]}}
    with override_settings(**{SETTINGS_NAME: {"LANES": lanes}}):
        worker = Worker(lane="bulk", interval=60)
        try:
            samples = scrape()  # no tick has run
            for key in served:
                assert missing(samples, key) == [], key
            for outcome in metrics.FAILOVER_OUTCOMES:
                labels = (("channel", hook.key), ("fallback", fallback.key), ("outcome", outcome))
                assert samples.get(("notifications_retry_failovers_total", labels)) == 0
            # Another lane's channel is that lane's worker's to publish.
            assert missing(samples, other_lane.key) == expected_totals(other_lane.key)
        finally:
            worker.close()


def test_a_channel_added_while_the_worker_runs_gets_its_counters_at_its_next_tick():
    worker = Worker(interval=60)
    try:
        added = ChannelFactory(key=f"later-{uuid.uuid4().hex[:8]}", provider_key="stub", is_enabled=False)
        assert missing(scrape(), added.key) == expected_totals(added.key)
        stats = worker.tick()
        assert not stats.error and not stats.skipped
        assert missing(scrape(), added.key) == []
    finally:
        worker.close()


def test_a_worker_started_while_the_database_cannot_be_read_still_starts(monkeypatch):
    from django.db import DatabaseError

    from notifications_retry.models import ChannelConfig

    tag = uuid.uuid4().hex[:8]
    channel = ChannelFactory(key=f"unread-{tag}", provider_key="in_app")

    def refused(*args, **kwargs):
        raise DatabaseError("connection refused")

    monkeypatch.setattr(ChannelConfig.objects, "all", refused)
    worker = Worker(interval=60)
    monkeypatch.undo()
    try:
        assert missing(scrape(), channel.key) == expected_totals(channel.key)
        assert not worker.tick().error
        assert missing(scrape(), channel.key) == []  # the first tick's load created them
    finally:
        worker.close()


@pytest.mark.parametrize("serving", [False, True])
def test_retry_worker_creates_the_series_at_zero_only_when_it_serves_metrics(settings, monkeypatch, serving):
    from django.core.management import call_command

    from notifications_retry.management.commands.retry_worker import Command

    tag = uuid.uuid4().hex[:8]
    hook, fallback = webhook_with_fallback(f"serve-hook-{tag}", f"serve-inbox-{tag}")
    settings.NOTIFICATIONS_RETRY = {"METRICS_PORT": None}
    # The command is told to serve /metrics; nothing needs to listen for the registry to be read here.
    monkeypatch.setattr(Command, "_serve_metrics", lambda self, addr, port: None)
    call_command("retry_worker", "--once", "--no-relay", *(["--metrics-port", "0"] if serving else []))
    samples = scrape()
    for key in (fallback.key, hook.key):
        assert missing(samples, key) == ([] if serving else expected_totals(key)), key
    failovers = [
        samples.get(
            (
                "notifications_retry_failovers_total",
                (("channel", hook.key), ("fallback", fallback.key), ("outcome", outcome)),
            )
        )
        for outcome in metrics.FAILOVER_OUTCOMES
    ]
    assert failovers == [0.0 if serving else None] * len(metrics.FAILOVER_OUTCOMES)
