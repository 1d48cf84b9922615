"""The ``nats`` publisher: JetStream publish with ``Nats-Msg-Id`` = event id (extra ``nats``).

:meth:`publish` returns only once the stream has acknowledged the event, so the relay never marks
an event the stream did not store. The broker's duplicate window drops a re-publish of the same
event id (after a relay crash between publishing and marking); its ack then says ``duplicate``,
which is a success. nats-py is asynchronous and the relay is not: the client lives on an event loop
of its own, on a daemon thread, for the publisher's life (so it keeps answering the server's pings
between batches). The relay hands it waves of one event per key (:meth:`publish_many`), published
at once, their acks awaited together.
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
    "servers": ["nats://127.0.0.1:4222"],
    "subject_prefix": "",
    "stream": None,
    "ack_timeout_seconds": 5.0,
    "connect_timeout_seconds": 2.0,
    "name": "notifications_retry outbox relay",
}

#: Headers of every message besides ``Nats-Msg-Id``: consumers partition by the key.
KEY_HEADER = "Event-Key"
TOPIC_HEADER = "Event-Topic"


class NatsPublisher(Publisher):
    """Publishes to the subject ``subject_prefix + topic``; options: see ``DEFAULTS`` and docs/events.md."""

    name: ClassVar[str] = "nats"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__({**DEFAULTS, **dict(options or {})})
        refuse_bad_options("nats", self.options_problems(self.options))
        self._nats: Any = broker_client("nats", publisher="nats", package="nats-py", extra="nats")
        servers = self.options["servers"]
        self.servers: list[str] = [servers] if isinstance(servers, str) else list(servers)
        self.ack_timeout = float(self.options["ack_timeout_seconds"])
        self.connect_timeout = float(self.options["connect_timeout_seconds"])
        self._client: Any = None
        self._last_error: Exception | None = None
        self._loop = LoopThread("notifications-retry-nats")

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        """Server URLs, names and numbers in range; unknown keys refused."""
        values = {**DEFAULTS, **dict(options)}
        problems = []
        servers = values["servers"]
        listed = [servers] if isinstance(servers, str) else servers
        if (
            not isinstance(listed, list | tuple)
            or not listed
            or not all(isinstance(s, str) and s.startswith(("nats://", "tls://")) for s in listed)
        ):
            problems.append(f"'servers' must be a nats:// URL or a list of them, got {servers!r}")
        if not isinstance(values["subject_prefix"], str):
            problems.append(f"'subject_prefix' must be a string, got {values['subject_prefix']!r}")
        if values["stream"] is not None and (not isinstance(values["stream"], str) or not values["stream"]):
            problems.append(f"'stream' must be a stream name or null, got {values['stream']!r}")
        for name in ("ack_timeout_seconds", "connect_timeout_seconds"):
            value = values[name]
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name!r} must be a number > 0, got {value!r}")
        unknown = sorted(set(options) - set(DEFAULTS))
        if unknown:
            problems.append(f"unknown option(s) {', '.join(unknown)}")
        return problems

    async def _connected(self) -> Any:
        if self._client is not None and self._client.is_connected:
            return self._client
        await self._drop()
        # No reconnection inside the client: after a failure the relay backs off and the next
        # publish connects again, so no message is buffered out of the relay's sight.
        # (nats-py reads max_reconnect_attempts=0 as "no limit"; 1 is one try of each server.)
        self._last_error = None
        self._client = await self._nats.connect(
            servers=self.servers,
            name=self.options["name"],
            connect_timeout=self.connect_timeout,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,
            error_cb=self._remember_error,
        )
        return self._client

    async def _remember_error(self, error: Exception) -> None:
        # The client's default logs a traceback per failed try; the relay logs the failure once.
        self._last_error = error

    async def _acked(self, client: Any, event: Mapping[str, Any]) -> PublishError | None:
        """Publish one event and wait for the stream's ack; the failure instead of raising."""
        event_id = str(event["event_id"])
        subject = f"{self.options['subject_prefix']}{event['topic']}"
        headers = {"Nats-Msg-Id": event_id, KEY_HEADER: str(event["key"]), TOPIC_HEADER: str(event["topic"])}
        try:
            await client.jetstream(timeout=self.ack_timeout).publish(
                subject,
                event_body(event),
                timeout=self.ack_timeout,
                stream=self.options["stream"],
                headers=headers,
            )
        except Exception as exc:
            # No stream for the subject, another stream, no ack in time, a dropped connection: the
            # event stays unmarked, and the broker side is not taking events now.
            return self._failure(f"nats did not store event {event_id} on {subject!r}", exc)
        return None

    def _failure(self, message: str, exc: BaseException) -> PublishError:
        detail = f"{message}: {type(exc).__name__}: {exc}"
        if self._last_error is not None:
            detail += f" (last client error: {self._last_error!r})"
        error = PublishError(detail, endpoint_down=True)
        error.__cause__ = exc
        return error

    async def _publish_all(self, events: Sequence[Mapping[str, Any]]) -> list[PublishError | None]:
        try:
            client = await self._connected()
        except Exception as exc:
            await self._drop()
            return [self._failure("cannot connect to nats", exc)]
        outcomes = list(await asyncio.gather(*(self._acked(client, event) for event in events)))
        if any(error is not None for error in outcomes):
            await self._drop()  # rebuilt at the next publish
        return outcomes

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self.connect_timeout)

    def publish_many(self, events: Sequence[Mapping[str, Any]]) -> list[PublishError | None]:
        """Publish events of distinct keys at once and wait for every ack."""
        if not events:
            return []
        bound = self.connect_timeout * 2 + self.ack_timeout + 5.0
        try:
            return self._loop.run(self._publish_all(events), bound)
        except TimeoutError as exc:
            with contextlib.suppress(Exception):
                self._loop.run(self._drop(), self.connect_timeout + 1.0)
            return [self._failure(f"nats did not answer within {bound:g}s", exc)]

    def publish(self, event: Mapping[str, Any]) -> None:
        """Publish one event and wait for the stream's ack; PublishError when it is not stored."""
        (error,) = self.publish_many([event])
        if error is not None:
            raise error

    def close(self) -> None:
        """Close the client and stop its loop."""
        if self._loop.running:
            with contextlib.suppress(Exception):
                self._loop.run(self._drop(), self.connect_timeout + 1.0)
        self._loop.stop()
