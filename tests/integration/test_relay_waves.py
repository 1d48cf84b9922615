"""The relay with a publisher that pipelines (``publish_many``): waves of one event per key, order kept."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from notifications_retry.models import Outbox
from notifications_retry.outbox.publishers import Publisher, PublishError
from notifications_retry.outbox.relay import Relay
from tests.support.outbox_events import make_events

pytestmark = pytest.mark.django_db


class RecordingPipeline(Publisher):
    """Accepts every event except those ``refuse`` says no to; records each wave it is given."""

    name = "recording"

    def __init__(self, refuse: Any = None, down_at_wave: int | None = None) -> None:
        super().__init__()
        self.refuse = refuse or (lambda event: False)
        self.down_at_wave = down_at_wave
        self.waves: list[list[Mapping[str, Any]]] = []

    def publish(self, event: Mapping[str, Any]) -> None:
        raise AssertionError("a pipelining publisher is given waves, not single events")

    def publish_many(self, events: Sequence[Mapping[str, Any]]) -> list[PublishError | None]:
        self.waves.append(list(events))
        if self.down_at_wave == len(self.waves):
            # The first event confirmed before the connection went; the rest not.
            return [None] + [PublishError("connection lost", endpoint_down=True)] * (len(events) - 1)
        return [PublishError("refused") if self.refuse(event) else None for event in events]


def test_each_wave_holds_one_event_per_key_in_creation_order(clock):
    make_events(clock, keys=3, generations=3)
    publisher = RecordingPipeline()
    report = Relay(publisher, clock=clock).batch()
    assert report.published == 9 and not report.failed
    assert [[e["generation"] for e in wave] for wave in publisher.waves] == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
    for wave in publisher.waves:
        assert len({e["key"] for e in wave}) == len(wave)
    assert not Outbox.objects.filter(published_at__isnull=True).exists()


def test_a_refused_event_holds_back_only_its_own_key(clock):
    keys = make_events(clock, keys=3, generations=3)
    victim = keys[1]
    publisher = RecordingPipeline(refuse=lambda e: e["key"] == victim and e["generation"] == 1)
    report = Relay(publisher, clock=clock).batch()
    assert report.blocked_keys == [victim] and report.failed == 1 and not report.endpoint_down
    # The victim's generation 2 was never handed over: its generation 1 must go first.
    assert sorted((e["key"], e["generation"]) for e in publisher.waves[2]) == sorted(
        (k, 2) for k in keys if k != victim
    )
    left = Outbox.objects.filter(published_at__isnull=True)
    assert sorted(left.values_list("key", "generation")) == [(victim, 1), (victim, 2)]


def test_endpoint_down_ends_the_batch_and_marks_only_what_was_confirmed(clock):
    make_events(clock, keys=3, generations=2)
    publisher = RecordingPipeline(down_at_wave=1)
    report = Relay(publisher, clock=clock).batch()
    assert report.endpoint_down and report.published == 1 and report.failed == 2
    assert len(publisher.waves) == 1
    (marked,) = Outbox.objects.filter(published_at__isnull=False)
    assert str(marked.event_id) == publisher.waves[0][0]["event_id"]
