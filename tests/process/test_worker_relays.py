"""``retry_worker`` as a real process publishes the outbox by default; ``--no-relay`` leaves it to
``outbox_relay``."""

from __future__ import annotations

import signal

import pytest

from notifications_retry import api
from notifications_retry.models import ChannelConfig, NotificationEntity, Outbox
from tests.process.conftest import seed_due
from tests.support.processes import wait_until

pytestmark = pytest.mark.process


def in_app() -> ChannelConfig:
    return ChannelConfig.objects.create(key="in_app", provider_key="in_app", max_attempts=3)


def test_once_sends_and_publishes_the_events_with_the_configured_publisher(start_worker):
    seed_due(in_app(), 5)
    worker = start_worker(["--once"])
    assert worker.wait(60) == 0, worker.output()[-3000:]
    assert NotificationEntity.objects.filter(status="sent").count() == 5
    assert Outbox.objects.count() == 5
    assert not Outbox.objects.filter(published_at__isnull=True).exists(), worker.output()[-3000:]
    output = worker.output()
    assert output.count("outbox-event-published") == 5  # the default publisher: a log line each
    tasks = next(line for line in output.splitlines() if "worker-tasks" in line)
    assert "relay" in tasks and "housekeeping" not in tasks  # --once runs no housekeeping


def test_no_relay_leaves_the_events_to_outbox_relay(start_worker):
    seed_due(in_app(), 5)
    worker = start_worker(["--once", "--no-relay"])
    assert worker.wait(60) == 0, worker.output()[-3000:]
    assert NotificationEntity.objects.filter(status="sent").count() == 5
    assert Outbox.objects.filter(published_at__isnull=True).count() == 5
    assert "outbox-event-published" not in worker.output()


def test_a_looping_worker_publishes_what_is_written_while_it_waits_and_stops_cleanly(start_worker):
    channel = in_app()
    worker = start_worker(["--interval", "60", "--no-housekeeping"])
    wait_until(lambda: "cycle-completed" in worker.output(), 30, message="a first tick")
    row = NotificationEntity.objects.create(channel=channel, recipient="a@example.com", payload={})
    api.cancel_notification(row.pk, actor="shop")  # an event written by the monolith, no row due
    wait_until(
        lambda: Outbox.objects.filter(key=str(row.pk), published_at__isnull=False).exists(),
        15,
        message="the event published while the worker waits for its next tick, a minute away",
    )
    event = Outbox.objects.get(key=str(row.pk))
    assert event.published_at is not None
    print(f"event delay: {(event.published_at - event.created_at).total_seconds():.3f} s")
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()[-3000:]
