"""Endpoint health on a real PostgreSQL and a real HTTP receiver: 410 Gone, the failure ratio, re-enabling."""

from __future__ import annotations

import random
from datetime import timedelta

import jsonschema
import pytest

from notifications_retry import signals
from notifications_retry.delivery import events, health
from notifications_retry.engine.worker import Worker
from notifications_retry.models import (
    CHANNEL_HEALTH_TOPIC,
    ChannelConfig,
    ChannelHealthBucket,
    ChannelHealthChange,
    NotificationEntity,
    Outbox,
)
from notifications_retry.rules.endpoint_health import Thresholds, Window, assess, bucket_start
from tests.conftest import allow_loopback
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply

pytestmark = pytest.mark.django_db

Status = NotificationEntity.Status
VALIDATOR = jsonschema.Draft202012Validator(events.health_schema(), format_checker=jsonschema.FormatChecker())
LIMITS = Thresholds(
    warn_ratio=0.8, disable_ratio=0.95, min_attempts=10, window_seconds=86_400, cooldown_seconds=3600
)


def health_settings(settings, **health):
    settings.NOTIFICATIONS_RETRY = {
        "ENDPOINT_HEALTH": {
            "min_attempts": 10,
            "warn_ratio": 0.8,
            "disable_ratio": 0.95,
            "reenable_cooldown_seconds": 3600,
            **health,
        },
        "BATCH_SIZE": 500,
        "CIRCUIT_BREAKER": {"failure_threshold": 10_000},  # every due row is called: the counts are exact
    }
    allow_loopback(settings)


def hook(server, **fields):
    fields.setdefault("max_attempts", 5)
    return ChannelFactory(key="partner_hook", provider_key="webhook", options={"url": server.url}, **fields)


def due(clock, channel, n):
    return [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=0,
            next_attempt_at=clock.now() - timedelta(seconds=1),
        )
        for _ in range(n)
    ]


def tick(clock):
    return Worker(clock=clock, rng=random.Random(3)).tick()


def health_events():
    return list(Outbox.objects.filter(topic=CHANNEL_HEALTH_TOPIC).order_by("id"))


# --- the pure rules -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "window", "expected"),
    [
        ("ok", Window(9, 9), None),  # too few calls to judge
        ("ok", Window(10, 7), None),
        ("ok", Window(10, 8), "warning"),
        ("ok", Window(20, 19), "disabled"),
        ("warning", Window(20, 19), "disabled"),
        ("warning", Window(20, 10), "ok"),
        ("warning", Window(3, 0), "ok"),
        ("ok", Window(1, 1, gone=True), "disabled"),
        ("disabled", Window(100, 100, gone=True), None),
    ],
)
def test_assess(state, window, expected):
    transition = assess(state, window, LIMITS)
    assert (transition.state if transition else None) == expected


def test_buckets_slice_the_window_in_24(clock):
    start = bucket_start(clock.now(), LIMITS)
    assert start <= clock.now() < start + timedelta(hours=1) and start.minute == start.second == 0


# --- 410 Gone -------------------------------------------------------------------------------------------


def test_410_gone_disables_the_channel_at_once_and_its_rows_wait(
    clock, webhook_server, settings, django_capture_on_commit_callbacks
):
    health_settings(settings)
    webhook_server.responder = lambda request: Reply(410, "gone")
    seen = []
    signals.channel_health_changed.connect(lambda **kw: seen.append(kw), weak=False, dispatch_uid="t410")
    try:
        channel = hook(webhook_server, max_concurrency=1)
        first = due(clock, channel, 1)[0]
        with django_capture_on_commit_callbacks(execute=True):  # the signal follows the commit
            tick(clock)
    finally:
        signals.channel_health_changed.disconnect(dispatch_uid="t410")
    channel.refresh_from_db()
    assert not channel.is_enabled and channel.health_state == "disabled"
    assert "410 Gone" in channel.health_reason and channel.health_changed_at == clock.now()
    change = ChannelHealthChange.objects.get(channel=channel)
    assert (change.state, change.previous_state, change.actor) == ("disabled", "ok", "system")
    (event,) = health_events()
    assert event.key == "partner_hook" and event.generation == 1
    assert event.payload["state"] == "disabled" and "410 Gone" in event.payload["reason"]
    VALIDATOR.validate(events.envelope(event))
    assert [s["state"] for s in seen] == ["disabled"] and seen[0]["channel"] == "partner_hook"
    first.refresh_from_db()
    assert first.dead_lettered_at is not None  # the 410 itself is a permanent failure
    # The channel's other rows wait untouched, as a disabled channel's always do.
    waiting = due(clock, channel, 3)
    requests = len(webhook_server.requests)
    tick(clock)
    assert len(webhook_server.requests) == requests
    for row in waiting:
        row.refresh_from_db()
        assert (row.status, row.attempts, row.attempt_log) == (Status.FAILED, 0, [])


# --- the failure ratio ----------------------------------------------------------------------------------


def test_a_channel_failing_past_the_ratio_is_warned_then_disabled(clock, webhook_server, settings):
    health_settings(settings)
    answers = iter([Reply(200, {"id": "ok"})] * 2 + [Reply(500, "down")] * 100)
    webhook_server.responder = lambda request: next(answers)
    channel = hook(webhook_server, max_concurrency=1, max_attempts=50)
    due(clock, channel, 10)
    tick(clock)  # 2 of 10 delivered, 8 failed: 80 % = the warning ratio
    channel.refresh_from_db()
    assert channel.is_enabled and channel.health_state == "warning"
    assert "8 of 10 calls failed (80%)" in channel.health_reason
    bucket = ChannelHealthBucket.objects.get(channel=channel)
    assert (bucket.attempts, bucket.failures) == (10, 8)
    clock.advance(3600)  # the 8 failed rows are due again and fail again: 16 of 18 (89 %)
    tick(clock)
    channel.refresh_from_db()
    assert channel.health_state == "warning"
    due(clock, channel, 30)
    clock.advance(3600)
    tick(clock)  # 8 + 30 more failures: 54 of 56 (96 %) past the disable ratio
    channel.refresh_from_db()
    assert not channel.is_enabled and channel.health_state == "disabled"
    assert "ENDPOINT_HEALTH['disable_ratio'] 95%" in channel.health_reason
    states = [e.payload["state"] for e in health_events()]
    assert states == ["warning", "disabled"]
    assert [e.generation for e in health_events()] == [1, 2]
    for event in health_events():
        VALIDATOR.validate(events.envelope(event))
    assert list(ChannelHealthChange.objects.filter(channel=channel).values_list("state", flat=True)) == [
        "disabled",
        "warning",
    ]


def test_a_success_that_brings_the_window_to_the_minimum_is_judged_on_the_share(
    clock, webhook_server, settings
):
    health_settings(settings)
    answers = iter([Reply(500, "down")] * 9 + [Reply(200, {"id": "x"})])
    webhook_server.responder = lambda request: next(answers)
    channel = hook(webhook_server, max_concurrency=1)
    due(clock, channel, 9)
    tick(clock)  # 9 failed of 9: below its min_attempts, the share says too little
    channel.refresh_from_db()
    assert channel.health_state == "ok"
    due(clock, channel, 1)
    tick(clock)  # a commit of one success: 9 failed of 10 (90 %), past the warning ratio
    channel.refresh_from_db()
    assert channel.health_state == "warning" and channel.is_enabled
    assert "9 of 10 calls failed (90%)" in channel.health_reason
    assert [e.payload["state"] for e in health_events()] == ["warning"]


def test_throttling_counts_neither_way(clock, webhook_server, settings):
    health_settings(settings, min_attempts=1)
    webhook_server.responder = lambda request: Reply(429, "slow down", headers={"Retry-After": "5"})
    channel = hook(webhook_server, max_concurrency=1)
    due(clock, channel, 3)
    tick(clock)
    channel.refresh_from_db()
    assert channel.health_state == "ok" and not ChannelHealthBucket.objects.exists()


def test_a_warning_clears_when_failures_fall_back(clock, webhook_server, settings):
    health_settings(settings)
    # The success first, then the nine failures: however the commits batch the outcomes, the window
    # reaches min_attempts at 9 failed of 10.
    answers = iter([Reply(200, {"id": "x"})] + [Reply(500, "down")] * 9 + [Reply(200, {"id": "x"})] * 100)
    webhook_server.responder = lambda request: next(answers)
    channel = hook(webhook_server, max_concurrency=1)
    due(clock, channel, 10)
    tick(clock)
    channel.refresh_from_db()
    assert channel.health_state == "warning"
    clock.advance(3600)
    due(clock, channel, 5)
    tick(clock)  # 9 failed of 24: back under 80 %
    channel.refresh_from_db()
    assert channel.health_state == "ok" and channel.is_enabled
    assert [e.payload["state"] for e in health_events()] == ["warning", "ok"]


# --- re-enabling ------------------------------------------------------------------------------------------


def test_reenabling_is_audited_refused_during_the_cooldown_and_starts_the_window_afresh(
    clock, webhook_server, settings
):
    health_settings(settings)
    webhook_server.responder = lambda request: Reply(410, "gone")
    channel = hook(webhook_server, max_concurrency=1)
    due(clock, channel, 1)
    tick(clock)
    channel.refresh_from_db()
    assert channel.health_state == "disabled"
    with pytest.raises(health.HealthCooldown, match="may be re-enabled in 59 min"):
        health.reenable(channel.pk, actor="ops", now=clock.now() + timedelta(seconds=30))
    channel.refresh_from_db()
    assert not channel.is_enabled
    later = clock.now() + timedelta(hours=1)
    entry = health.reenable(channel.pk, actor="ops", reason="partner restored the endpoint", now=later)
    channel.refresh_from_db()
    assert channel.is_enabled and channel.health_state == "ok" and channel.health_window_start == later
    assert (entry.actor, entry.previous_state, entry.state) == ("ops", "disabled", "ok")
    assert "partner restored" in entry.reason
    assert [e.payload["state"] for e in health_events()] == ["disabled", "ok"]
    assert health_events()[-1].payload["actor"] == "ops"
    with pytest.raises(Exception, match="not disabled by its health check"):
        health.reenable(channel.pk, actor="ops", now=later)
    # The failures before the re-enable no longer count: one failure now is 1 of 1, under min attempts.
    clock.advance(3601)
    webhook_server.responder = lambda request: Reply(500, "hiccup")
    due(clock, channel, 1)
    tick(clock)
    channel.refresh_from_db()
    assert channel.health_state == "ok" and channel.is_enabled


def test_two_writers_never_announce_one_change_twice(clock):
    channel = ChannelFactory(key="c1", provider_key="stub")
    from notifications_retry.rules.endpoint_health import Transition

    first = health.change(channel.pk, "ok", Transition("warning", "x"), clock.now())
    second = health.change(channel.pk, "ok", Transition("warning", "x"), clock.now())
    assert first is not None and second is None
    assert Outbox.objects.filter(topic=CHANNEL_HEALTH_TOPIC).count() == 1
    assert ChannelConfig.objects.get(pk=channel.pk).health_changes == 1


# --- the admin ----------------------------------------------------------------------------------------------


def auto_disabled(clock, key="partner_hook"):
    from notifications_retry.rules.endpoint_health import Transition

    channel = ChannelFactory(key=key, provider_key="stub")
    health.change(channel.pk, "ok", Transition("disabled", "the endpoint answered 410 Gone"), clock.now())
    channel.refresh_from_db()
    return channel


def test_the_admin_shows_health_and_reenables_only_through_the_audited_action(admin_client, settings):
    from django.contrib.admin.models import LogEntry
    from django.urls import reverse
    from django.utils import timezone

    from notifications_retry.runtime.clock import ManualClock
    from tests.integration.test_admin_pages import channel_form

    settings.NOTIFICATIONS_RETRY = {"ENDPOINT_HEALTH": {"reenable_cooldown_seconds": 600}}
    clock = ManualClock(timezone.now() - timedelta(minutes=5))
    channel = auto_disabled(clock)
    listing = reverse("admin:notifications_retry_channelconfig_changelist")
    page = admin_client.get(listing).content.decode()
    assert "410 Gone" in page and "disabled" in page
    detail = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    page = admin_client.get(detail).content.decode()
    assert "ok → disabled" in page and "system" in page
    # The plain enable action, the list's checkbox and the form refuse to turn it on.
    admin_client.post(listing, {"action": "enable_channels", "_selected_action": [channel.pk], "index": 0})
    edited = admin_client.post(detail, channel_form(channel, is_enabled="on"))
    assert edited.status_code == 200 and "Re-enable after an automatic disable" in edited.content.decode()
    channel.refresh_from_db()
    assert not channel.is_enabled
    # The action refuses during the cooldown (5 of 10 minutes gone), then re-enables, audited.
    action = {"action": "reenable_channels", "_selected_action": [channel.pk], "index": 0}
    response = admin_client.post(listing, action, follow=True)
    assert "may be re-enabled in 4 min" in response.content.decode()
    channel.refresh_from_db()
    assert not channel.is_enabled
    ChannelConfig.objects.filter(pk=channel.pk).update(
        health_changed_at=timezone.now() - timedelta(minutes=11)
    )
    response = admin_client.post(listing, action, follow=True)
    assert "Re-enabled 1 channel(s)." in response.content.decode()
    channel.refresh_from_db()
    assert channel.is_enabled and channel.health_state == "ok"
    assert ChannelHealthChange.objects.filter(channel=channel, actor="admin", state="ok").exists()
    assert LogEntry.objects.filter(object_id=str(channel.pk), change_message__contains="Re-enabled").exists()
