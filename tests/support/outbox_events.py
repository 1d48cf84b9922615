"""Outbox events to relay, made the way the worker makes them, and the order a relay must keep."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import timedelta

from notifications_retry.delivery import triage
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity, Outbox
from tests.factories import ChannelFactory, NotificationFactory

Status = NotificationEntity.Status


def make_events(clock, keys: int, generations: int = 2) -> list[str]:
    """``keys`` notifications with one event per generation each, created generation by generation.

    Generation g < last is a terminal failure followed by an audited requeue; the last one is Sent.
    Events of one key are therefore spread over the outbox, interleaved with other keys'.
    """
    channel = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"}, max_attempts=3)
    rows = [
        NotificationFactory(
            channel=channel,
            status=Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=1),
        )
        for _ in range(keys)
    ]
    worker = Worker(clock=clock, rng=random.Random(1))
    for generation in range(generations):
        if generation == generations - 1:
            channel.provider_key, channel.options = "in_app", {}
            channel.save()
        worker.tick()
        if generation < generations - 1:
            triage.requeue([r.pk for r in rows], actor="test", reason="again", now=clock.now())
        clock.advance(1)
    worker.close()
    assert Outbox.objects.count() == keys * generations
    return [str(r.pk) for r in rows]


def assert_order_per_key(bodies: list[dict]) -> None:
    """Counting each event at its first receipt, every key's events arrive in creation order."""
    seen: set[str] = set()
    per_key: dict[str, list[int]] = defaultdict(list)
    for body in bodies:
        if body["event_id"] in seen:
            continue
        seen.add(body["event_id"])
        per_key[body["key"]].append(body["generation"])
    for key, generations in per_key.items():
        assert generations == sorted(generations), (key, generations)
