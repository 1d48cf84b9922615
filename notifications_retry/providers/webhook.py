"""Webhook provider: POST the notification as JSON, idempotent by ``Idempotency-Key``."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import queue
import ssl
import threading
import time
import typing
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpcore
import httpx

from ..exceptions import PermanentProviderError, ProviderThrottled, RetryableProviderError
from .base import ChannelSettings, OutgoingMessage, Provider, SendResult

#: A success answer larger than this is not parsed for an id: a webhook answers briefly.
MAX_RESPONSE_BYTES = 64 * 1024


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def classify_response(status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
    """Map an HTTP answer to a result or a classified error (SPEC §5's table, in one place)."""
    if 200 <= status < 300:
        return SendResult(provider_message_id=_message_id(body))
    retry_after = parse_retry_after(headers.get("retry-after"))
    reason = f"webhook answered HTTP {status}"
    if status == 429:
        raise ProviderThrottled(reason, kind="throttled", retry_after=retry_after)
    if status == 503:
        raise RetryableProviderError(reason, kind="http_5xx", retry_after=retry_after)
    if status == 408:
        raise RetryableProviderError(reason, kind="timeout")
    if status >= 500:
        raise RetryableProviderError(reason, kind="http_5xx")
    if 400 <= status < 500:
        raise PermanentProviderError(reason, kind="http_4xx")
    raise PermanentProviderError(f"{reason} (redirects are not followed)", kind="http_unexpected")


def _message_id(body: bytes) -> str | None:
    if not body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and data.get("id") is not None:
        return str(data["id"])[:255]
    return None


# The deadline of the request running on this thread; every socket operation waits at most until it.
_deadline = threading.local()


def _time_left(kind: type[Exception]) -> float:
    deadline: float | None = getattr(_deadline, "at", None)
    if deadline is None:
        return float("inf")
    left = deadline - time.monotonic()
    if left <= 0:
        raise kind("webhook request deadline passed")
    return left


def _bounded(timeout: float | None, kind: type[Exception]) -> float | None:
    left = _time_left(kind)
    if left == float("inf"):
        return timeout
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose reads and writes never wait past the request's deadline.

    httpx's timeouts apply per socket operation: a server dripping its headers one byte a second
    would hold a request forever. Bounding each operation by the time left bounds the request.
    """

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(
        self, ssl_context: typing.Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        inner = self.inner.start_tls(ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(inner)

    def get_extra_info(self, info: str) -> typing.Any:
        return self.inner.get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    """httpcore's socket backend with every stream bounded by the thread's request deadline."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = super().connect_tcp(
            host, port, _bounded(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlineStream(stream)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying TLS context for every client: building one loads the CA bundle (tens of ms)."""
    return httpx.create_ssl_context()


def _connection_pool() -> httpcore.ConnectionPool:
    """One keep-alive connection whose socket operations never outlive the request's deadline."""
    return httpcore.ConnectionPool(
        ssl_context=_ssl_context(),
        max_connections=1,
        max_keepalive_connections=1,
        network_backend=_DeadlineBackend(),
    )


class WebhookProvider(Provider):
    """``POST options["url"]``; options: ``url`` (required), ``headers``, ``secret`` (HMAC signature)."""

    key: ClassVar[str] = "webhook"

    def __init__(self, channel: ChannelSettings) -> None:
        super().__init__(channel)
        options = channel.options
        self.url: str = options["url"]
        self.extra_headers: dict[str, str] = dict(options.get("headers") or {})
        self.secret: str | None = options.get("secret")
        self.timeout = float(channel.timeout_seconds)
        self._timeouts = {
            "connect": self.timeout,
            "read": self.timeout,
            "write": self.timeout,
            "pool": self.timeout,
        }
        # One single-connection pool per concurrent send, handed out LIFO (warm connections first):
        # threads sharing one pool contend on its lock, which scans every idle connection per request;
        # the channel still opens at most max_concurrency connections. The requests go through httpcore,
        # httpx's own transport layer: httpx's client layer cost as much CPU again per request
        # (0.66 vs 0.39 ms measured), and a latency-bound drain is CPU-bound in the worker.
        self._pools: queue.LifoQueue[httpcore.ConnectionPool] = queue.LifoQueue()
        self._all_pools = [_connection_pool() for _ in range(max(1, int(channel.max_concurrency)))]
        for pool in self._all_pools:
            self._pools.put(pool)

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = super().options_problems(options)
        if problems:
            return problems
        url = options.get("url")
        if not url or not isinstance(url, str):
            return ["webhook channel needs options['url']"]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(f"webhook url must be an http(s) URL with a host, got {url!r}")
        headers = options.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            problems.append("webhook option 'headers' must map header names to strings")
        if "secret" in options and not isinstance(options["secret"], str):
            problems.append("webhook option 'secret' must be a string")
        return problems

    def body(self, message: OutgoingMessage) -> bytes:
        """The request body; byte-identical for every attempt of one notification."""
        document = {
            "notification_id": str(message.notification_id),
            "tenant_id": str(message.tenant_id) if message.tenant_id else None,
            "channel": message.channel,
            "recipient": message.recipient,
            "notification_type": message.notification_type,
            "payload": message.payload,
        }
        try:
            return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise PermanentProviderError(
                f"payload cannot be serialized: {exc}", kind="serialization"
            ) from exc

    def send(self, message: OutgoingMessage) -> SendResult:
        body = self.body(message)
        headers = {
            **self.extra_headers,
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            "Idempotency-Key": str(message.notification_id),
        }
        if self.secret:
            digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            headers["X-Signature"] = f"sha256={digest}"
        deadline = time.monotonic() + self.timeout
        try:
            # The worker never runs more sends of a channel at once than it has connections; wait if
            # a caller outside the worker does.
            pool = self._pools.get(timeout=self.timeout)
        except queue.Empty:
            raise RetryableProviderError(
                "no free webhook connection within the timeout", kind="timeout"
            ) from None
        _deadline.at = deadline
        try:
            with pool.stream(
                "POST",
                self.url,
                headers=list(headers.items()),
                content=body,
                extensions={"timeout": self._timeouts},
            ) as response:
                received = bytearray()
                # Per-read timeouts do not bound a server that drips bytes: check the whole deadline too.
                for chunk in response.iter_stream():
                    if time.monotonic() > deadline:
                        raise RetryableProviderError(
                            f"webhook answer took longer than {self.timeout:g}s", kind="timeout"
                        )
                    if len(received) < MAX_RESPONSE_BYTES:
                        received.extend(chunk[: MAX_RESPONSE_BYTES - len(received)])
                answer_headers = {
                    k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers
                }
                return classify_response(response.status, answer_headers, bytes(received))
        except httpcore.TimeoutException as exc:
            raise RetryableProviderError(f"webhook timed out: {exc!r}", kind="timeout") from exc
        except httpcore.ConnectError as exc:
            raise RetryableProviderError(f"webhook connection failed: {exc!r}", kind="connection") from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise RetryableProviderError(f"webhook transport error: {exc!r}", kind="transport") from exc
        finally:
            _deadline.at = None
            self._pools.put(pool)

    def close(self) -> None:
        for pool in self._all_pools:
            pool.close()
