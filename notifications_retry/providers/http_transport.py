"""An asyncio HTTP/1.1 client for providers: keep-alive connections, a deadline per request.

Why not httpx's ``AsyncClient``: a latency-bound drain is CPU-bound in the worker, and the client is
most of that CPU. Measured on one machine, 32 requests in flight against a receiver on 127.0.0.1,
CPU per request: httpx ``AsyncClient`` 6.7 ms, httpcore's async pool 9.8 ms, httpcore's sync pool on
32 threads 0.87 ms, aiohttp 0.40 ms, h11 on asyncio streams 0.34 ms, and this module (an asyncio
protocol feeding httptools, the llhttp parser uvicorn uses) 0.10 ms. What is left here is the
product's own part: connection reuse and the request's deadline; parsing is httptools'.

One pool belongs to one event loop. Every request runs under one deadline (connect, write and the
whole answer), so a server dripping its answer a byte at a time is still bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import ssl
import typing
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httptools

__all__ = [
    "ConnectFailed",
    "ConnectionPool",
    "ProtocolFailure",
    "RequestTimeout",
    "Response",
    "TransportError",
    "check_header",
    "run_sync",
]


_T = TypeVar("_T")


def run_sync(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` to completion from synchronous code, on a new event loop.

    A thread that already runs a loop (a notebook, a Playwright session, an async framework's
    thread) cannot start another: the coroutine then runs on a short-lived thread of its own.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="notifications-retry-sync") as pool:
        return pool.submit(asyncio.run, coroutine).result()


class TransportError(Exception):
    """A request that got no usable answer; ``kind`` names why, in the SPEC's error kinds."""

    kind = "transport"


class ConnectFailed(TransportError):
    kind = "connection"


class RequestTimeout(TransportError):
    kind = "timeout"


class ProtocolFailure(TransportError):
    kind = "transport"


class _StaleConnection(Exception):
    """A kept-alive connection the server closed before answering: safe to retry on a new one."""


@dataclasses.dataclass(frozen=True)
class Response:
    """A complete answer; header names are lower case; ``body`` is cut at the pool's ``max_body``."""

    status: int
    headers: dict[str, str]
    body: bytes


def check_header(name: str, value: str) -> None:
    """Raise ValueError for a header HTTP/1.1 cannot carry as given."""
    # A CR or LF would let a configured header value start a header (or a request) of its own.
    if any(c in name for c in "\r\n\0:") or not name or any(c in value for c in "\r\n\0"):
        raise ValueError(f"invalid HTTP header {name!r}")


class _Connection(asyncio.Protocol):
    """One socket; one request at a time; the answer is parsed as it arrives."""

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Response] | None = None
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._headers_done = False
        self._received = False
        self._keep_alive = True

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, hence no isinstance).
        self.transport = typing.cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.close()
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolFailure(f"malformed HTTP answer: {exc}"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost settles a pending request

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._headers_done and not self._framed():
            self._complete(keep_alive=False)  # an answer delimited by the connection's close
        elif not self._received and self.used:
            waiter.set_exception(_StaleConnection())
        else:
            waiter.set_exception(ProtocolFailure("connection closed before the answer was complete"))

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        room = self.max_body - len(self._body)
        self._body += body[:room]
        if len(body) > room:
            # Enough of an answer that should be short: settle now instead of reading the rest.
            self._complete(keep_alive=False)
            self.close()

    def on_message_complete(self) -> None:
        if 100 <= self._status < 200:
            self._reset()  # an interim answer (100 Continue): the real one follows
            self._received = True
            return
        self._complete(keep_alive=self._parser.should_keep_alive())

    # -- requests --------------------------------------------------------------------------------

    def _framed(self) -> bool:
        return "content-length" in self._headers or "chunked" in self._headers.get("transfer-encoding", "")

    def _complete(self, *, keep_alive: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._keep_alive = keep_alive
            self._waiter.set_result(Response(self._status, self._headers, bytes(self._body)))

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.close()

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive

    async def exchange(self, request: bytes) -> Response:
        assert self.transport is not None
        self._reset()
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        try:
            return await self._waiter
        finally:
            self._waiter = None
            self.used = True

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class ConnectionPool:
    """Keep-alive connections to one URL's origin, at most ``max_connections`` at once."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int,
        max_body: int,
        ssl_context: Callable[[], ssl.SSLContext],
        user_agent: str = "",
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``headers`` go on every request: checked and formatted once, here."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL with a host: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.tls = parts.scheme == "https"
        self.max_body = max_body
        self._ssl_context = ssl_context
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.rsplit("@", 1)[-1]
        if any(ord(c) <= 32 or ord(c) == 127 for c in target + host_header):
            raise ValueError(f"URL has spaces or control characters: {url!r}")
        fixed = [("Host", host_header), *([("User-Agent", user_agent)] if user_agent else []), *headers]
        for name, value in fixed:
            check_header(name, value)
        # Everything after the method, up to the per-request headers.
        self._head = f" {target} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in fixed)
        self._idle: list[_Connection] = []  # LIFO: the warmest connection first
        self._limit = asyncio.Semaphore(max(1, max_connections))
        self._loop: asyncio.AbstractEventLoop | None = None

    async def request(
        self, method: str, headers: Sequence[tuple[str, str]], body: bytes, *, timeout: float
    ) -> Response:
        """Send one request and read its answer, all within ``timeout`` seconds."""
        for name, value in headers:
            check_header(name, value)
        data = (
            method
            + self._head
            + "".join(f"{name}: {value}\r\n" for name, value in headers)
            + f"Content-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("a ConnectionPool serves the event loop it was first used on")
        try:
            async with asyncio.timeout(timeout):
                async with self._limit:
                    return await self._exchange(data)
        except TimeoutError:
            raise RequestTimeout(f"no complete answer within {timeout:g}s") from None

    async def _exchange(self, data: bytes) -> Response:
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._use(conn, data)
            except _StaleConnection:
                pass  # the server dropped the idle connection; nothing of this request was answered
        conn = await self._connect()
        try:
            return await self._use(conn, data)
        except _StaleConnection:
            raise ProtocolFailure("connection closed before any answer") from None

    async def _use(self, conn: _Connection, data: bytes) -> Response:
        try:
            response = await conn.exchange(data)
        except BaseException:
            conn.close()  # cancelled or failed mid-request: its framing is unknown
            raise
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.close()
        return response

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(self.max_body),
                self.host,
                self.port,
                ssl=self._ssl_context() if self.tls else None,
                server_hostname=self.host if self.tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc!r}") from exc
        return conn

    def close(self) -> None:
        """Close the idle connections (a request in flight closes its own when it ends).

        Safe from any thread: transports are closed on the pool's own loop.
        """
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:
                loop.call_soon_threadsafe(self._close_idle)
                return
        self._close_idle()

    def _close_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()
