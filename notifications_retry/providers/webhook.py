"""Webhook provider: POST the notification as JSON, idempotent by ``Idempotency-Key``."""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

import httpx

from .. import __version__
from ..exceptions import PermanentProviderError, ProviderThrottled, RetryableProviderError
from .base import ChannelSettings, OutgoingMessage, Provider, SendResult
from .http_transport import ConnectFailed, ConnectionPool, TransportError, check_header, run_sync

#: A success answer larger than this is not parsed for an id: a webhook answers briefly.
MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = f"notifications-retry/{__version__}"
#: Headers the request framing owns: options cannot override them.
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})


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
    # 429 and 503 refuse the request before processing it: nothing went out (failover may follow).
    if status == 429:
        raise ProviderThrottled(reason, kind="throttled", retry_after=retry_after, ambiguous=False)
    if status == 503:
        raise RetryableProviderError(reason, kind="http_5xx", retry_after=retry_after, ambiguous=False)
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


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One verifying TLS context for every client: building one loads the CA bundle (tens of ms)."""
    return httpx.create_ssl_context()


class WebhookProvider(Provider):
    """``POST options["url"]``; options: ``url`` (required), ``headers``, ``secret`` (HMAC signature)."""

    key: ClassVar[str] = "webhook"
    enforces_timeout = True  # one deadline over each whole request (http_transport)

    def __init__(self, channel: ChannelSettings) -> None:
        super().__init__(channel)
        options = channel.options
        self.url: str = options["url"]
        self.extra_headers: dict[str, str] = dict(options.get("headers") or {})
        self.secret: str | None = options.get("secret")
        self.timeout = float(channel.timeout_seconds)
        self.max_connections = max(1, int(channel.max_concurrency))
        # Created on the first asynchronous send, on the loop that sends (the worker's).
        self._pool: ConnectionPool | None = None

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
        elif any(ord(c) <= 32 or ord(c) == 127 for c in url):
            problems.append(f"webhook url must not contain spaces or control characters, got {url!r}")
        headers = options.get("headers", {})
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            problems.append("webhook option 'headers' must map header names to strings")
        else:
            for name, value in headers.items():
                try:
                    check_header(name, value)
                except ValueError:
                    problems.append(f"webhook header {name!r} has a character HTTP does not allow")
                    continue
                if name.lower() in RESERVED_HEADERS:
                    problems.append(f"webhook header {name!r} is set by the provider itself")
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

    def _request(self, message: OutgoingMessage) -> tuple[list[tuple[str, str]], bytes]:
        """The body and the headers that change per message (the rest are the pool's)."""
        body = self.body(message)
        headers = [("Idempotency-Key", str(message.notification_id))]
        if self.secret:
            digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            headers.append(("X-Signature", f"sha256={digest}"))
        return headers, body

    def _new_pool(self, max_connections: int) -> ConnectionPool:
        # The options' headers, minus those the provider sets per message, go on every request.
        fixed = {**self.extra_headers, "Content-Type": "application/json"}
        fixed.pop("Idempotency-Key", None)
        if self.secret:
            fixed.pop("X-Signature", None)
        try:
            return ConnectionPool(
                self.url,
                max_connections=max_connections,
                max_body=MAX_RESPONSE_BYTES,
                ssl_context=_ssl_context,
                user_agent=USER_AGENT,
                headers=list(fixed.items()),
            )
        except ValueError as exc:  # a URL or header the options should not have let through
            raise PermanentProviderError(
                f"webhook request is invalid: {exc}", kind="invalid_request"
            ) from exc

    async def _post(self, pool: ConnectionPool, message: OutgoingMessage) -> SendResult:
        headers, body = self._request(message)
        try:
            response = await pool.request("POST", headers, body, timeout=self.timeout)
        except TransportError as exc:
            # No connection (refused, unresolvable name): the request never left. Anything later may
            # have reached the receiver, so it stays ambiguous.
            unsent = isinstance(exc, ConnectFailed)
            raise RetryableProviderError(
                f"webhook {exc.kind} failure: {exc}", kind=exc.kind, ambiguous=not unsent
            ) from exc
        return classify_response(response.status, response.headers, response.body)

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        """POST on the running loop over kept-alive connections (at most ``max_concurrency``)."""
        if self._pool is None:
            self._pool = self._new_pool(self.max_connections)
        return await self._post(self._pool, message)

    def send(self, message: OutgoingMessage) -> SendResult:
        """POST from synchronous code, on a connection of its own (the worker sends asynchronously)."""
        pool = self._new_pool(1)

        async def once() -> SendResult:
            try:
                return await self._post(pool, message)
            finally:
                pool.close()

        return run_sync(once())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
