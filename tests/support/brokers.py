"""The real brokers of the publisher tests: RabbitMQ on 127.0.0.1:5672, NATS JetStream on 127.0.0.1:4222.

Every test gets names of its own (exchange, queue, stream, subjects) and removes them afterwards.
Outside CI a test skips, saying why, when its broker is not running; with ``CI`` set it fails.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

RABBITMQ_PORT = 5672
NATS_PORT = 4222
TOPIC = "pin.notifications.dispatched.v1"


def require_broker(name: str, port: int) -> None:
    """Skip (outside CI) or fail (in CI) when nothing listens on 127.0.0.1:``port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        reason = f"{name} is not reachable on 127.0.0.1:{port} ({exc})"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the broker tests")
        pytest.skip(f"{reason}; start it to run this test")


class RabbitMQBox:
    """A durable topic exchange and a queue bound to every routing key, both this test's own."""

    def __init__(self) -> None:
        import pika

        suffix = uuid.uuid4().hex[:12]
        self.exchange = f"nr-test-{suffix}"
        self.queue = f"nr-test-{suffix}"
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url()))
        self.channel = self.connection.channel()
        self.channel.exchange_declare(self.exchange, exchange_type="topic", durable=True)
        self.channel.queue_declare(self.queue, durable=True)
        self.channel.queue_bind(self.queue, self.exchange, routing_key="#")

    @staticmethod
    def url(port: int = RABBITMQ_PORT) -> str:
        return f"amqp://guest:guest@127.0.0.1:{port}/%2F"

    def options(self, port: int = RABBITMQ_PORT, **extra: Any) -> dict[str, Any]:
        return {"url": self.url(port), "exchange": self.exchange, **extra}

    def count(self) -> int:
        return int(self.channel.queue_declare(self.queue, passive=True).method.message_count)

    def drain(self) -> list[dict[str, Any]]:
        """Every message in the queue, in order: its properties, routing key and decoded body."""
        messages = []
        while True:
            method, properties, body = self.channel.basic_get(self.queue, auto_ack=True)
            if method is None:
                return messages
            messages.append(
                {
                    "message_id": properties.message_id,
                    "delivery_mode": properties.delivery_mode,
                    "routing_key": method.routing_key,
                    "headers": properties.headers,
                    "body": json.loads(body),
                }
            )

    def close(self) -> None:
        self.channel.queue_delete(self.queue)
        self.channel.exchange_delete(self.exchange)
        self.connection.close()


def rabbitmq_box() -> Iterator[RabbitMQBox]:
    require_broker("RabbitMQ", RABBITMQ_PORT)
    box = RabbitMQBox()
    try:
        yield box
    finally:
        box.close()


async def _with_nats(action: Any) -> Any:
    import nats

    client = await nats.connect(f"nats://127.0.0.1:{NATS_PORT}", connect_timeout=2, allow_reconnect=False)
    try:
        return await action(client)
    finally:
        await client.close()


def _run(coroutine: Any) -> Any:
    """Run a coroutine to completion on a thread of its own: the calling thread may have a loop
    running already (a browser test's driver leaves one), and asyncio.run refuses to nest."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class NatsBox:
    """A JetStream stream over this test's subjects, with a two-minute duplicate window."""

    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:12]
        self.stream = f"NR_TEST_{suffix}"
        self.prefix = f"nrtest.{suffix}."

        async def create(client: Any) -> None:
            from nats.js.api import StreamConfig

            await client.jetstream().add_stream(
                StreamConfig(name=self.stream, subjects=[f"{self.prefix}>"], duplicate_window=120.0)
            )

        _run(_with_nats(create))

    @staticmethod
    def url(port: int = NATS_PORT) -> str:
        return f"nats://127.0.0.1:{port}"

    def options(self, port: int = NATS_PORT, **extra: Any) -> dict[str, Any]:
        return {"servers": [self.url(port)], "subject_prefix": self.prefix, "stream": self.stream, **extra}

    def count(self) -> int:
        async def count(client: Any) -> int:
            info = await client.jetstream().stream_info(self.stream)
            return int(info.state.messages)

        return int(_run(_with_nats(count)))

    def messages(self) -> list[dict[str, Any]]:
        """Every stored message in stream order: subject, headers and decoded body."""

        async def read(client: Any) -> list[dict[str, Any]]:
            js = client.jetstream()
            info = await js.stream_info(self.stream)
            stored: list[dict[str, Any]] = []
            if not info.state.messages:
                return stored
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                msg = await js.get_msg(self.stream, seq)
                stored.append(
                    {"subject": msg.subject, "headers": msg.headers or {}, "body": json.loads(msg.data)}
                )
            return stored

        return list(_run(_with_nats(read)))

    def close(self) -> None:
        async def delete(client: Any) -> None:
            await client.jetstream().delete_stream(self.stream)

        _run(_with_nats(delete))


def nats_box() -> Iterator[NatsBox]:
    require_broker("NATS", NATS_PORT)
    box = NatsBox()
    try:
        yield box
    finally:
        box.close()
