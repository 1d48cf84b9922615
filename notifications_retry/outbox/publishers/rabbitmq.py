"""The ``rabbitmq`` publisher: AMQP 0-9-1 with publisher confirms, through aio-pika (extra ``rabbitmq``).

Every event is published persistent (delivery mode 2), ``mandatory``, with ``message_id`` = the
event id and the routing key = the topic, to a configurable exchange. An event counts as accepted
only once the broker's confirm for it has arrived, so the relay never marks an event the broker did
not take. An unroutable event (returned: no queue is bound), a negative confirm, no confirm within
``confirm_timeout_seconds`` and a lost connection are failures; after a failure of the connection it
is dropped and the next publish opens a new one.

The relay hands this publisher its batch in waves of one event per key (:meth:`publish_many`): a
wave is published at once and its confirms awaited together, so the broker's disk writes are shared
instead of one round trip per event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from notifications_retry.outbox.publishers.base import (
    Publisher,
    PublishError,
    broker_client,
    event_body,
    refuse_bad_options,
)
from notifications_retry.runtime.asyncio_bridge import LoopThread

DEFAULTS: dict[str, Any] = {
    "url": "amqp://guest:guest@127.0.0.1:5672/%2F",
    "exchange": "notifications_retry",
    "exchange_type": "topic",
    "declare_exchange": True,
    "connect_timeout_seconds": 5.0,
    "confirm_timeout_seconds": 10.0,
    "heartbeat_seconds": 30,
    "connection_name": "notifications_retry outbox relay",
}
EXCHANGE_TYPES = ("topic", "direct", "fanout", "headers")


class RabbitMQPublisher(Publisher):
    """Publishes to ``options["exchange"]`` with confirms; options: see ``DEFAULTS`` and docs/events.md."""

    name: ClassVar[str] = "rabbitmq"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__({**DEFAULTS, **dict(options or {})})
        refuse_bad_options("rabbitmq", self.options_problems(self.options))
        self._aio_pika: Any = broker_client(
            "aio_pika", publisher="rabbitmq", package="aio-pika", extra="rabbitmq"
        )
        self.exchange_name: str = self.options["exchange"]
        self.connect_timeout = float(self.options["connect_timeout_seconds"])
        self.confirm_timeout = float(self.options["confirm_timeout_seconds"])
        self._loop = LoopThread("notifications-retry-rabbitmq")
        self._connection: Any = None
        self._exchange: Any = None
        self._unclosed: list[Any] = []

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
        if values["exchange_type"] not in EXCHANGE_TYPES:
            problems.append(
                f"'exchange_type' must be one of {', '.join(EXCHANGE_TYPES)}, got {values['exchange_type']!r}"
            )
        if not isinstance(values["declare_exchange"], bool):
            problems.append("'declare_exchange' must be true or false")
        for name in ("connect_timeout_seconds", "confirm_timeout_seconds", "heartbeat_seconds"):
            value = values[name]
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name!r} must be a number > 0, got {value!r}")
        if not isinstance(values["connection_name"], str):
            problems.append("'connection_name' must be a string")
        unknown = sorted(set(options) - set(DEFAULTS))
        if unknown:
            problems.append(f"unknown option(s) {', '.join(unknown)}")
        return problems

    # -- on the publisher's loop -------------------------------------------------------------------

    async def _open(self) -> Any:
        if (
            self._exchange is not None
            and not self._connection.is_closed
            and not self._exchange.channel.is_closed
        ):
            return self._exchange
        await self._drop()
        from aio_pika.connection import Connection, make_url

        # aio_pika.connect() as written out, to close a connection whose opening failed: left to the
        # garbage collector, it would schedule its own close on whatever thread collects it.
        connection = Connection(
            make_url(self.options["url"], heartbeat=int(self.options["heartbeat_seconds"])),
            client_properties={"connection_name": self.options["connection_name"]},
        )
        try:
            await connection.connect(timeout=self.connect_timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        self._connection = connection
        # Confirms on; a returned (unroutable) message raises instead of being handed to a callback.
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        if self.exchange_name and self.options["declare_exchange"]:
            self._exchange = await channel.declare_exchange(
                self.exchange_name, self.options["exchange_type"], durable=True
            )
        elif self.exchange_name:
            self._exchange = await channel.get_exchange(self.exchange_name, ensure=False)
        else:
            self._exchange = channel.default_exchange
        return self._exchange

    async def _drop(self) -> None:
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), self.connect_timeout)
            # One whose close did not finish is kept until the loop is closed: collected earlier, it
            # would schedule its own close on whatever thread collects it.
            self._unclosed = [c for c in self._unclosed if not c.is_closed]
            if not connection.is_closed:
                self._unclosed.append(connection)

    def _message(self, event: Mapping[str, Any]) -> Any:
        aio_pika = self._aio_pika
        return aio_pika.Message(
            event_body(event),
            message_id=str(event["event_id"]),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            content_type="application/json",
            type=str(event["topic"]),
            app_id="notifications_retry",
            headers={
                "key": str(event["key"]),
                "generation": int(event["generation"]),
                "contract_version": int(event["contract_version"]),
            },
        )

    async def _confirmed(self, exchange: Any, event: Mapping[str, Any]) -> PublishError | None:
        """Publish one event and wait for its confirm; the failure, classified, instead of raising."""
        aio_pika = self._aio_pika
        event_id, topic = event["event_id"], str(event["topic"])
        try:
            await exchange.publish(self._message(event), topic, mandatory=True, timeout=self.confirm_timeout)
        except aio_pika.exceptions.PublishError as exc:  # returned: routed to no queue
            # No queue is bound for the topic: every event would fail alike, so stop and back off.
            return _failure(
                f"event {event_id} is unroutable on exchange {self.exchange_name!r} (routing key {topic!r}): "
                "bind a queue",
                exc,
            )
        except aio_pika.exceptions.DeliveryError as exc:  # nack
            return _failure(f"broker refused event {event_id} (nack)", exc)
        except TimeoutError as exc:
            return _failure(
                f"no confirm for event {event_id} within {self.confirm_timeout:g}s", exc, lost=True
            )
        except Exception as exc:
            return _failure(f"rabbitmq unavailable: {type(exc).__name__}: {exc}", exc, lost=True)
        return None

    async def _publish_all(self, events: Sequence[Mapping[str, Any]]) -> list[PublishError | None]:
        try:
            exchange = await self._open()
        except Exception as exc:
            await self._drop()
            return [_failure(f"rabbitmq unavailable: {type(exc).__name__}: {exc}", exc, lost=True)]
        outcomes = list(await asyncio.gather(*(self._confirmed(exchange, event) for event in events)))
        if any(isinstance(error, _ConnectionLost) for error in outcomes):
            await self._drop()  # its state is unknown: the next publish opens a new one
        return outcomes

    # -- the relay's side ---------------------------------------------------------------------------

    def publish_many(self, events: Sequence[Mapping[str, Any]]) -> list[PublishError | None]:
        """Publish events of distinct keys at once and wait for every confirm."""
        if not events:
            return []
        bound = self.connect_timeout + self.confirm_timeout + 5.0
        try:
            return self._loop.run(self._publish_all(events), bound)
        except TimeoutError as exc:
            with contextlib.suppress(Exception):
                self._loop.run(self._drop(), self.connect_timeout + 1.0)
            return [_failure(f"rabbitmq did not answer within {bound:g}s", exc, lost=True)]

    def publish(self, event: Mapping[str, Any]) -> None:
        """Publish one event and wait for its confirm; PublishError when it is not confirmed."""
        (error,) = self.publish_many([event])
        if error is not None:
            raise error

    def close(self) -> None:
        """Close the connection and stop the publisher's loop."""
        if self._loop.running:
            with contextlib.suppress(Exception):
                self._loop.run(self._drop(), self.connect_timeout + 1.0)
        self._loop.stop()
        self._unclosed.clear()


class _ConnectionLost(PublishError):
    """A failure after which the connection's state is unknown: it is dropped, the next publish reconnects."""


def _failure(message: str, cause: BaseException, *, lost: bool = False) -> PublishError:
    """A failure of one event; every one of them means the broker side is not taking events now."""
    error = (_ConnectionLost if lost else PublishError)(message, endpoint_down=True)
    error.__cause__ = cause
    return error
