"""The ``nats`` publisher: JetStream publish with ``Nats-Msg-Id`` = event id (extra ``nats``).

:meth:`publish` returns only once the stream has acknowledged the event, so the relay never marks
an event the stream did not store. The broker's duplicate window drops a re-publish of the same
event id (after a relay crash between publishing and marking); its ack then says ``duplicate``,
which is a success. nats-py is asynchronous and the relay is not: the client lives on an event loop
of its own, on a daemon thread, for the publisher's life (so it keeps answering the server's pings
between batches).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Mapping
from typing import Any, ClassVar

from notifications_retry.outbox.publishers.base import Publisher, PublishError, event_body

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
        problems = self.options_problems(self.options)
        if problems:
            raise ValueError("nats publisher: " + "; ".join(problems))
        try:
            import nats
        except ImportError as exc:  # an optional dependency: say which extra brings it
            raise ValueError(
                "the nats publisher needs nats-py: pip install 'django-notifications-retry[nats]'"
            ) from exc
        self._nats = nats
        servers = self.options["servers"]
        self.servers: list[str] = [servers] if isinstance(servers, str) else list(servers)
        self.ack_timeout = float(self.options["ack_timeout_seconds"])
        self.connect_timeout = float(self.options["connect_timeout_seconds"])
        self._client: Any = None
        self._last_error: Exception | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

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

    def _run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the client's loop and wait for it (bounded: connect + ack + slack)."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="notifications-retry-nats", daemon=True
            )
            self._thread.start()
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(self.connect_timeout + self.ack_timeout + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

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

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str]) -> Any:
        client = await self._connected()
        stream = self.options["stream"]
        return await client.jetstream(timeout=self.ack_timeout).publish(
            subject, body, timeout=self.ack_timeout, stream=stream, headers=headers
        )

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), self.connect_timeout)

    def publish(self, event: Mapping[str, Any]) -> None:
        """Publish one event and wait for the stream's ack; PublishError when it is not stored."""
        event_id = str(event["event_id"])
        subject = f"{self.options['subject_prefix']}{event['topic']}"
        headers = {"Nats-Msg-Id": event_id, KEY_HEADER: str(event["key"]), TOPIC_HEADER: str(event["topic"])}
        try:
            self._run(self._publish(subject, event_body(event), headers))
        except Exception as exc:
            # Any failure (no server, no stream for the subject, no ack in time, a dropped
            # connection) leaves the event unmarked; the client is rebuilt at the next publish.
            with contextlib.suppress(Exception):
                self._run(self._drop())
            detail = f"{type(exc).__name__}: {exc}"
            if self._last_error is not None:
                detail += f" (last client error: {self._last_error!r})"
            raise PublishError(
                f"nats did not store event {event_id} on {subject!r}: {detail}", endpoint_down=True
            ) from exc

    def close(self) -> None:
        """Close the client and stop its loop."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(Exception):
                self._run(self._drop())
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
        if not thread.is_alive():
            loop.close()
        self._loop, self._thread = None, None
