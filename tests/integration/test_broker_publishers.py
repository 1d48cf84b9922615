"""The ``rabbitmq`` and ``nats`` publishers through the real relay, against the real brokers on loopback.

What is checked: a consumer reads every event, once per event id, in creation order per key; an event
is marked published only once the broker confirmed it (RabbitMQ) or the stream acknowledged it
(NATS); an unreachable broker or a connection cut mid-batch (by a TCP proxy this test controls)
marks nothing unconfirmed, loses nothing, and the relay recovers by itself.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection

from notifications_retry.delivery import events
from notifications_retry.models import Outbox
from notifications_retry.outbox.publishers import (
    NatsPublisher,
    PublishError,
    RabbitMQPublisher,
    get_publisher,
)
from notifications_retry.outbox.relay import Relay
from tests.support.brokers import (
    NATS_PORT,
    RABBITMQ_PORT,
    TOPIC,
    NatsBox,
    RabbitMQBox,
)
from tests.support.outbox_events import assert_order_per_key, make_events
from tests.support.processes import free_port
from tests.support.tcp_proxy import TcpProxy


def all_event_ids() -> set[str]:
    return {str(e) for e in Outbox.objects.values_list("event_id", flat=True)}


def marked_event_ids() -> set[str]:
    return {
        str(e) for e in Outbox.objects.filter(published_at__isnull=False).values_list("event_id", flat=True)
    }


def assert_every_event_once_in_key_order(bodies: list[dict[str, Any]]) -> None:
    ids = [b["event_id"] for b in bodies]
    assert len(ids) == len(set(ids)), "an event reached the consumer twice without a failure"
    assert set(ids) == all_event_ids()
    assert_order_per_key(bodies)
    assert not Outbox.objects.filter(published_at__isnull=True).exists()


def cut_during_wave(proxy: TcpProxy, wave: int, hold: float) -> Any:
    """A hook for the publisher's ``wave``-th call: the broker takes the wave's events, their confirms
    or acks never come back, and ``hold`` seconds later every connection is cut (the proxy forwards
    again for new ones). Returns the hook; ``hook.cut`` holds the event ids of that wave."""
    calls = {"n": 0}

    def before_publish(events: Any) -> None:
        calls["n"] += 1
        if calls["n"] == wave:
            before_publish.cut = {str(e["event_id"]) for e in events}  # type: ignore[attr-defined]
            proxy.swallow(True)

            def cut() -> None:
                proxy.drop()
                proxy.swallow(False)

            threading.Timer(hold, cut).start()

    before_publish.cut = set()  # type: ignore[attr-defined]
    return before_publish


def relay_until_drained(relay: Relay, timeout: float = 30) -> None:
    """Run the relay's loop on a thread until the outbox is empty, then stop it."""

    def run() -> None:
        try:
            relay.run()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + timeout
    while Outbox.objects.filter(published_at__isnull=True).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    relay.stop()
    thread.join(15)
    assert not thread.is_alive()


# --- RabbitMQ --------------------------------------------------------------------------------------------


class HookedRabbitMQPublisher(RabbitMQPublisher):
    hook: Any = None

    def publish_many(self, events: Any) -> Any:
        if self.hook is not None:
            self.hook(events)
        return super().publish_many(events)


@pytest.mark.django_db
def test_rabbitmq_gets_every_event_confirmed_persistent_and_in_key_order(clock, rabbitmq):
    make_events(clock, keys=4, generations=3)
    reports = Relay(get_publisher("rabbitmq", rabbitmq.options()), clock=clock, batch_size=5).run(once=True)
    assert sum(r.published for r in reports) == 12
    messages = rabbitmq.drain()
    assert_every_event_once_in_key_order([m["body"] for m in messages])
    for message in messages:
        assert message["message_id"] == message["body"]["event_id"]
        assert message["delivery_mode"] == 2  # persistent
        assert message["routing_key"] == TOPIC == message["body"]["topic"]
        assert message["headers"]["key"] == message["body"]["key"]


@pytest.mark.django_db
def test_rabbitmq_unroutable_event_is_a_failure_and_nothing_is_marked(clock, rabbitmq):
    make_events(clock, keys=2)
    rabbitmq.channel.queue_unbind(rabbitmq.queue, rabbitmq.exchange, routing_key="#")
    publisher = RabbitMQPublisher(rabbitmq.options())
    report = Relay(publisher, clock=clock).batch()
    publisher.close()
    # The first wave (one event per key) was tried and returned; the second was not tried.
    assert report.endpoint_down and report.published == 0 and report.failed == 2
    assert not marked_event_ids()


@pytest.mark.django_db
def test_rabbitmq_unreachable_marks_nothing(clock):
    make_events(clock, keys=2)
    publisher = RabbitMQPublisher({"url": RabbitMQBox.url(free_port()), "connect_timeout_seconds": 2})
    with pytest.raises(PublishError) as info:
        publisher.publish(
            {"event_id": "e", "key": "k", "topic": TOPIC, "generation": 0, "contract_version": 1}
        )
    assert info.value.endpoint_down
    report = Relay(publisher, clock=clock).batch()
    assert report.endpoint_down and not marked_event_ids()


@pytest.mark.django_db(transaction=True)
def test_rabbitmq_connection_cut_mid_batch_loses_nothing_and_the_relay_recovers(clock, rabbitmq):
    make_events(clock, keys=5, generations=2)
    proxy = TcpProxy(RABBITMQ_PORT).start()
    try:
        publisher = HookedRabbitMQPublisher(rabbitmq.options(proxy.port))
        publisher.hook = cut_during_wave(proxy, wave=2, hold=0.3)
        relay = Relay(publisher, clock=clock, batch_size=6, interval=0.05, max_backoff=0.2)
        relay_until_drained(relay)
    finally:
        proxy.stop()
    assert proxy.connections >= 2, "the relay did not reconnect"
    messages = rabbitmq.drain()
    bodies = [m["body"] for m in messages]
    # The cut wave reached the queue but its confirms were cut off: not marked, and published again.
    ids = [b["event_id"] for b in bodies]
    duplicates = {i for i in ids if ids.count(i) > 1}
    assert duplicates == publisher.hook.cut and duplicates
    for event_id in duplicates:
        first, again = [m for m in messages if m["message_id"] == event_id]
        assert first["body"] == again["body"]  # the same event, the same message_id: consumers drop it
    assert set(ids) == all_event_ids() == marked_event_ids()
    assert_order_per_key(bodies)


# --- NATS JetStream ---------------------------------------------------------------------------------------


class HookedNatsPublisher(NatsPublisher):
    hook: Any = None

    def publish_many(self, events: Any) -> Any:
        if self.hook is not None:
            self.hook(events)
        return super().publish_many(events)


@pytest.mark.django_db
def test_nats_stream_stores_every_event_with_its_msg_id_in_key_order(clock, jetstream):
    make_events(clock, keys=4, generations=3)
    publisher = get_publisher("nats", jetstream.options())
    reports = Relay(publisher, clock=clock, batch_size=5).run(once=True)
    assert sum(r.published for r in reports) == 12
    stored = jetstream.messages()
    assert_every_event_once_in_key_order([m["body"] for m in stored])
    for message in stored:
        assert message["headers"]["Nats-Msg-Id"] == message["body"]["event_id"]
        assert message["headers"]["Event-Key"] == message["body"]["key"]
        assert message["subject"] == jetstream.prefix + TOPIC


@pytest.mark.django_db
def test_nats_duplicate_window_drops_a_republish_and_it_counts_as_published(clock, jetstream):
    make_events(clock, keys=2)
    crashed = NatsPublisher(jetstream.options())
    for event in Outbox.objects.order_by("id"):
        crashed.publish(events.envelope(event))  # published, then the relay died before marking
    crashed.close()
    reports = Relay(NatsPublisher(jetstream.options()), clock=clock).run(once=True)
    assert sum(r.published for r in reports) == 4
    assert marked_event_ids() == all_event_ids()
    assert jetstream.count() == 4


@pytest.mark.django_db
def test_nats_without_a_stream_for_the_subject_marks_nothing(clock, jetstream):
    make_events(clock, keys=2)
    options = jetstream.options(subject_prefix="nrtest.nostream.", stream=None, ack_timeout_seconds=1)
    publisher = NatsPublisher(options)
    report = Relay(publisher, clock=clock).batch()
    publisher.close()
    assert report.endpoint_down and report.published == 0
    assert not marked_event_ids()


@pytest.mark.django_db
def test_nats_unreachable_marks_nothing(clock):
    make_events(clock, keys=2)
    publisher = NatsPublisher({"servers": NatsBox.url(free_port()), "connect_timeout_seconds": 1})
    report = Relay(publisher, clock=clock).batch()
    publisher.close()
    assert report.endpoint_down and not marked_event_ids()


@pytest.mark.django_db(transaction=True)
def test_nats_connection_cut_mid_batch_loses_nothing_and_the_relay_recovers(clock, jetstream):
    make_events(clock, keys=5, generations=2)
    proxy = TcpProxy(NATS_PORT).start()
    try:
        publisher = HookedNatsPublisher(jetstream.options(proxy.port, ack_timeout_seconds=1))
        publisher.hook = cut_during_wave(proxy, wave=2, hold=0.3)
        relay = Relay(publisher, clock=clock, batch_size=6, interval=0.05, max_backoff=0.2)
        relay_until_drained(relay)
    finally:
        proxy.stop()
    assert proxy.connections >= 2, "the relay did not reconnect"
    stored = jetstream.messages()
    # The cut wave was stored though its acks were cut off; its re-publish fell in the duplicate window.
    assert publisher.hook.cut
    assert_every_event_once_in_key_order([m["body"] for m in stored])
    assert marked_event_ids() == all_event_ids()


def test_broker_publishers_refuse_bad_options():
    with pytest.raises(ValueError, match="'url' must be an amqp"):
        get_publisher("rabbitmq", {"url": "http://x"})
    with pytest.raises(ValueError, match="unknown option"):
        get_publisher("rabbitmq", {"exchnage": "x"})
    with pytest.raises(ValueError, match="'servers' must be a nats"):
        get_publisher("nats", {"servers": []})
    with pytest.raises(ValueError, match="'ack_timeout_seconds' must be a number"):
        get_publisher("nats", {"ack_timeout_seconds": 0})


EVENT = {"key": "k", "topic": TOPIC, "generation": 0, "contract_version": 1}


@pytest.mark.parametrize("broker", ["rabbitmq", "nats"])
def test_an_idle_connection_the_broker_closed_is_reopened_without_a_failure(request, broker):
    box = request.getfixturevalue("rabbitmq" if broker == "rabbitmq" else "jetstream")
    proxy = TcpProxy(RABBITMQ_PORT if broker == "rabbitmq" else NATS_PORT).start()
    publisher = get_publisher(broker, box.options(proxy.port))
    try:
        publisher.publish({**EVENT, "event_id": "before"})
        proxy.drop()  # the broker closes the connection while the relay has nothing to publish
        time.sleep(0.2)
        publisher.publish({**EVENT, "event_id": "after"})
    finally:
        publisher.close()
        proxy.stop()
    assert proxy.connections == 2
    if broker == "rabbitmq":
        assert [m["message_id"] for m in box.drain()] == ["before", "after"]
    else:
        assert [m["headers"]["Nats-Msg-Id"] for m in box.messages()] == ["before", "after"]


@pytest.mark.parametrize("broker", ["rabbitmq", "nats"])
def test_a_broker_that_takes_events_but_never_answers_fails_them_in_time(request, broker):
    box = request.getfixturevalue("rabbitmq" if broker == "rabbitmq" else "jetstream")
    proxy = TcpProxy(RABBITMQ_PORT if broker == "rabbitmq" else NATS_PORT).start()
    publisher = get_publisher(broker, box.options(proxy.port))
    try:
        publisher.publish({**EVENT, "event_id": "first"})  # connected, under the default timeout
        # From now on the broker's answers are held back: a short wait for them keeps the test fast.
        if isinstance(publisher, RabbitMQPublisher):
            publisher.confirm_timeout = 0.5
        else:
            publisher.ack_timeout = 0.5
        proxy.swallow(True)
        started = time.monotonic()
        outcomes = publisher.publish_many([{**EVENT, "event_id": f"silent-{k}", "key": k} for k in "ab"])
        waited = time.monotonic() - started
        proxy.swallow(False)
        publisher.publish({**EVENT, "event_id": "later"})
    finally:
        publisher.close()
        proxy.stop()
    assert len(outcomes) == 2 and all(o is not None and o.endpoint_down for o in outcomes)
    assert waited < 3
    assert proxy.connections == 2  # the silent connection was given up, a new one opened
    if broker == "rabbitmq":
        ids = [m["message_id"] for m in box.drain()]
    else:
        ids = [m["headers"]["Nats-Msg-Id"] for m in box.messages()]
    assert ids[0] == "first" and ids[-1] == "later"
