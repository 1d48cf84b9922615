"""The ``rabbitmq`` publisher: AMQP 0-9-1 with publisher confirms, through pika (extra ``rabbitmq``).

Every event is published persistent (delivery mode 2), ``mandatory``, with ``message_id`` = the
event id and the routing key = the topic, to a configurable exchange; :meth:`publish` returns only
once the broker has confirmed it, so the relay never marks an event the broker did not take. An
unroutable event (returned: no queue is bound) or a negative confirm is a failure, like a lost
connection. After a failure the connection is dropped and the next event opens a new one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, ClassVar

from notifications_retry.outbox.publishers.base import Publisher, PublishError, event_body

DEFAULTS: dict[str, Any] = {
    "url": "amqp://guest:guest@127.0.0.1:5672/%2F",
    "exchange": "notifications_retry",
    "exchange_type": "topic",
    "declare_exchange": True,
    "connect_timeout_seconds": 5.0,
    "heartbeat_seconds": 30,
    "connection_name": "notifications_retry outbox relay",
}


class RabbitMQPublisher(Publisher):
    """Publishes to ``options["exchange"]`` with confirms; options: see ``DEFAULTS`` and docs/events.md."""

    name: ClassVar[str] = "rabbitmq"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__({**DEFAULTS, **dict(options or {})})
        problems = self.options_problems(self.options)
        if problems:
            raise ValueError("rabbitmq publisher: " + "; ".join(problems))
        try:
            import pika
        except ImportError as exc:  # an optional dependency: say which extra brings it
            raise ValueError(
                "the rabbitmq publisher needs pika: pip install 'django-notifications-retry[rabbitmq]'"
            ) from exc
        self._pika = pika
        self.exchange: str = self.options["exchange"]
        self._connection: Any = None
        self._channel: Any = None

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        """URL scheme, names and numbers in range; unknown keys refused."""
        values = {**DEFAULTS, **dict(options)}
        problems = []
        url = values["url"]
        if not isinstance(url, str) or not url.startswith(("amqp://", "amqps://")):
            problems.append(f"'url' must be an amqp:// or amqps:// URL, got {url!r}")
        if not isinstance(values["exchange"], str):
            problems.append(
                f"'exchange' must be a string ('' is the default exchange), got {values['exchange']!r}"
            )
        if values["exchange_type"] not in ("topic", "direct", "fanout", "headers"):
            problems.append(
                f"'exchange_type' must be topic, direct, fanout or headers, got {values['exchange_type']!r}"
            )
        if not isinstance(values["declare_exchange"], bool):
            problems.append("'declare_exchange' must be true or false")
        for name in ("connect_timeout_seconds", "heartbeat_seconds"):
            value = values[name]
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name!r} must be a number > 0, got {value!r}")
        unknown = sorted(set(options) - set(DEFAULTS))
        if unknown:
            problems.append(f"unknown option(s) {', '.join(unknown)}")
        return problems

    def _open(self) -> Any:
        if self._channel is not None and self._channel.is_open:
            # A blocking connection only does I/O when asked: between batches nobody answers the
            # broker's heartbeats, and an idle relay's connection may have been closed meanwhile.
            # Find out now, before publishing, when nothing of ours is in flight.
            try:
                self._connection.process_data_events(time_limit=0)
            except (self._pika.exceptions.AMQPError, OSError):
                pass
            else:
                if self._channel.is_open:
                    return self._channel
        self.close()
        pika = self._pika
        params = pika.URLParameters(self.options["url"])
        params.connection_attempts = 1
        params.socket_timeout = float(self.options["connect_timeout_seconds"])
        params.blocked_connection_timeout = float(self.options["connect_timeout_seconds"])
        # A broker that stops answering (no confirm ever comes) is noticed by the missed heartbeats.
        params.heartbeat = int(self.options["heartbeat_seconds"])
        params.client_properties = {"connection_name": self.options["connection_name"]}
        self._connection = pika.BlockingConnection(params)
        channel = self._connection.channel()
        channel.confirm_delivery()
        if self.options["declare_exchange"] and self.exchange:
            channel.exchange_declare(self.exchange, exchange_type=self.options["exchange_type"], durable=True)
        self._channel = channel
        return channel

    def publish(self, event: Mapping[str, Any]) -> None:
        """Publish one event and wait for its confirm; PublishError when it is not confirmed."""
        pika = self._pika
        properties = pika.BasicProperties(
            message_id=str(event["event_id"]),
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type="application/json",
            type=str(event["topic"]),
            app_id="notifications_retry",
            headers={
                "key": str(event["key"]),
                "generation": int(event["generation"]),
                "contract_version": int(event["contract_version"]),
            },
        )
        try:
            channel = self._open()
            channel.basic_publish(
                self.exchange, str(event["topic"]), event_body(event), properties, mandatory=True
            )
        except pika.exceptions.UnroutableError as exc:
            # No queue is bound for the topic: every event would fail alike, so stop and back off.
            raise PublishError(
                f"event {event['event_id']} is unroutable on exchange {self.exchange!r} "
                f"(routing key {event['topic']!r}): bind a queue",
                endpoint_down=True,
            ) from exc
        except pika.exceptions.NackError as exc:
            raise PublishError(
                f"broker refused event {event['event_id']} (nack)", endpoint_down=True
            ) from exc
        except (pika.exceptions.AMQPError, OSError) as exc:
            self.close()  # the connection's state is unknown: the next event opens a new one
            raise PublishError(
                f"rabbitmq unavailable: {type(exc).__name__}: {exc}", endpoint_down=True
            ) from exc

    def close(self) -> None:
        """Close the connection (whatever state it is in)."""
        connection, self._connection, self._channel = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()
