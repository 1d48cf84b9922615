"""The webhook's asyncio HTTP/1.1 transport against raw servers on 127.0.0.1: framing, reuse, limits."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from notifications_retry.exceptions import PermanentProviderError, RetryableProviderError
from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
from notifications_retry.providers.http_transport import (
    ConnectFailed,
    ConnectionPool,
    ProtocolFailure,
    RequestTimeout,
    run_sync,
)
from notifications_retry.providers.webhook import MAX_RESPONSE_BYTES, WebhookProvider

OK = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"id":"a1"}'
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawServer"], Awaitable[None]]


class RawServer:
    """An asyncio TCP server that answers with scripted bytes; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.open_now = 0
        self.most_open = 0

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook?x=1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.handler(reader, writer, self)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request


def keep_alive(answer: bytes = OK, delay: float = 0.0) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        while True:
            await server.read_request(reader)
            if delay:
                await asyncio.sleep(delay)
            writer.write(answer)
            await writer.drain()

    return handler


def one_answer_then_close(answer: bytes = OK) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.read_request(reader)
        writer.write(answer)
        await writer.drain()

    return handler


def pool_for(url: str, max_connections: int = 4, max_body: int = MAX_RESPONSE_BYTES) -> ConnectionPool:
    return ConnectionPool(
        url, max_connections=max_connections, max_body=max_body, ssl_context=ssl.create_default_context
    )


def message() -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), None, "webhook", "+33600000000", {"n": 1}, 1, 5, "transactional")


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    # run_sync: the browser tests leave a running loop in this thread (Playwright's sync API).
    run_sync(asyncio.wait_for(coroutine, 20))


def test_kept_alive_connection_is_reused():
    async def scenario() -> None:
        async with RawServer(keep_alive()) as server:
            pool = pool_for(server.url)
            for _ in range(3):
                response = await pool.request("POST", [("X-A", "1")], b"{}", timeout=5)
                assert (response.status, response.body) == (200, b'{"id":"a1"}')
            assert server.connections == 1
            first = server.requests[0]
            assert first.startswith(b"POST /hook?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
            assert b"\r\nX-A: 1\r\n" in first and b"\r\nContent-Length: 2\r\n" in first
            pool.close()

    run(scenario())


def test_connection_the_server_dropped_while_idle_is_replaced():
    async def scenario() -> None:
        async with RawServer(one_answer_then_close()) as server:
            pool = pool_for(server.url)
            assert (await pool.request("POST", [], b"{}", timeout=5)).status == 200
            await asyncio.sleep(0.05)  # the server has closed the kept-alive connection meanwhile
            assert (await pool.request("POST", [], b"{}", timeout=5)).status == 200
            assert server.connections == 2 and len(server.requests) == 2
            pool.close()

    run(scenario())


def test_connection_close_answer_is_not_reused():
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"

    async def scenario() -> None:
        async with RawServer(keep_alive(answer)) as server:
            pool = pool_for(server.url)
            for _ in range(2):
                assert (await pool.request("POST", [], b"{}", timeout=5)).status == 200
            assert server.connections == 2
            pool.close()

    run(scenario())


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"id\r\n6\r\n":"c"}\r\n0\r\n\r\n',
            b'{"id":"c"}',
        ),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", b"ok"),
        (b"HTTP/1.0 200 OK\r\n\r\nuntil-close", b"until-close"),
    ],
    ids=["chunked", "interim-100", "close-delimited"],
)
def test_answer_framings(answer, body):
    async def scenario() -> None:
        async with RawServer(one_answer_then_close(answer)) as server:
            pool = pool_for(server.url)
            response = await pool.request("POST", [], b"{}", timeout=5)
            assert response.body == body and 200 <= response.status < 300
            pool.close()

    run(scenario())


def test_oversized_answer_is_cut_and_its_connection_dropped():
    big = b"x" * 10_000
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)

    async def scenario() -> None:
        async with RawServer(keep_alive(answer)) as server:
            pool = pool_for(server.url, max_body=100)
            response = await pool.request("POST", [], b"{}", timeout=5)
            assert response.status == 200 and response.body == big[:100]
            await pool.request("POST", [], b"{}", timeout=5)
            assert server.connections == 2  # the half-read connection was not reused
            pool.close()

    run(scenario())


def test_malformed_answer_and_early_close_are_transport_failures():
    async def scenario() -> None:
        async with RawServer(one_answer_then_close(b"SMTP ready\r\n\r\n")) as server:
            with pytest.raises(ProtocolFailure, match="malformed"):
                await pool_for(server.url).request("POST", [], b"{}", timeout=5)
        half = b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort"
        async with RawServer(one_answer_then_close(half)) as server:
            with pytest.raises(ProtocolFailure, match="before the answer was complete"):
                await pool_for(server.url).request("POST", [], b"{}", timeout=5)

    run(scenario())


def test_dripping_server_is_bounded_by_the_whole_request_deadline():
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer) -> None:
        await server.read_request(reader)
        for byte in OK:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        async with RawServer(drip) as server:
            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await pool_for(server.url).request("POST", [], b"{}", timeout=0.5)
            assert time.monotonic() - started < 1.5

    run(scenario())


def test_at_most_max_connections_are_open():
    async def scenario() -> None:
        async with RawServer(keep_alive(delay=0.05)) as server:
            pool = pool_for(server.url, max_connections=3)
            answers = await asyncio.gather(*[pool.request("POST", [], b"{}", timeout=5) for _ in range(12)])
            assert [a.status for a in answers] == [200] * 12
            assert server.most_open == 3 and server.connections == 3
            pool.close()

    run(scenario())


def test_refused_connection_and_foreign_loop():
    async def refused() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectFailed):
            await pool_for(f"http://127.0.0.1:{port}/").request("POST", [], b"", timeout=2)

    run(refused())
    pool = pool_for("http://127.0.0.1:9/")

    async def use() -> None:
        with contextlib.suppress(ConnectFailed):
            await pool.request("POST", [], b"", timeout=0.5)

    run_sync(use())
    with pytest.raises(RuntimeError, match="event loop"):
        run_sync(use())


@pytest.mark.parametrize(
    "headers", [[("X-Evil", "a\r\nInjected: 1")], [("X-Evil\r\n", "a")], [("", "a")], [("A:B", "c")]]
)
def test_header_that_would_split_the_request_is_refused(headers):
    async def scenario() -> None:
        async with RawServer(keep_alive()) as server:
            with pytest.raises(ValueError, match="invalid HTTP header"):
                await pool_for(server.url).request("POST", headers, b"{}", timeout=5)
            assert server.requests == []

    run(scenario())


def test_sync_send_works_where_a_loop_already_runs(webhook_server):
    provider = WebhookProvider(ChannelSettings("webhook", "webhook", 2.0, 1, {"url": webhook_server.url}))
    results = []

    async def inside_a_loop() -> None:
        # As from a notebook cell or an async framework's thread: this thread's loop is running.
        results.append(provider.send(message()).provider_message_id)

    run(inside_a_loop())
    assert results == ["msg-1"] and len(webhook_server.requests) == 1


def test_fixed_headers_and_a_url_with_braces():
    async def scenario() -> None:
        async with RawServer(keep_alive()) as server:
            pool = ConnectionPool(
                server.url.replace("/hook", "/hook/{id}"),
                max_connections=1,
                max_body=100,
                ssl_context=ssl.create_default_context,
                headers=[("X-Fixed", "f")],
            )
            await pool.request("POST", [("X-Each", "e")], b"{}", timeout=5)
            (request,) = server.requests
            assert request.startswith(b"POST /hook/{id}?x=1 HTTP/1.1\r\n")
            assert b"\r\nX-Fixed: f\r\nX-Each: e\r\nContent-Length: 2\r\n\r\n{}" in request
            pool.close()

    run(scenario())
    with pytest.raises(ValueError, match="invalid HTTP header"):
        ConnectionPool(
            "http://h/",
            max_connections=1,
            max_body=1,
            ssl_context=ssl.create_default_context,
            headers=[("X", "a\r\nb")],
        )


def test_url_with_control_characters_is_refused():
    with pytest.raises(ValueError, match="control characters"):
        pool_for("http://127.0.0.1:9/a b")
    with pytest.raises(ValueError, match="http"):
        pool_for("ftp://127.0.0.1/")


def test_webhook_send_async_keeps_connections_and_classifies():
    async def scenario() -> None:
        async with RawServer(keep_alive()) as server:
            provider = WebhookProvider(ChannelSettings("webhook", "webhook", 2.0, 2, {"url": server.url}))
            results = await asyncio.gather(*[provider.send_async(message()) for _ in range(6)])
            assert {r.provider_message_id for r in results} == {"a1"}
            assert server.connections <= 2
            provider.close()
        throttled = b"HTTP/1.1 429 Too Many\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"
        async with RawServer(keep_alive(throttled)) as server:
            provider = WebhookProvider(ChannelSettings("webhook", "webhook", 2.0, 2, {"url": server.url}))
            with pytest.raises(RetryableProviderError) as info:
                await provider.send_async(message())
            assert (info.value.kind, info.value.retry_after) == ("throttled", 7.0)
            provider.close()

    run(scenario())


def test_webhook_refuses_invalid_headers_in_options():
    problems = WebhookProvider.options_problems(
        {"url": "http://h/x y", "headers": {"X-A": "1\r\nX-B: 2", "Host": "other", "Content-Length": "9"}}
    )
    assert any("spaces or control characters" in p for p in problems)
    assert any("'X-A'" in p and "character" in p for p in problems)
    assert any("'Host'" in p and "set by the provider" in p for p in problems)
    assert any("'Content-Length'" in p for p in problems)
    provider = WebhookProvider(
        ChannelSettings(
            "webhook", "webhook", 1.0, 1, {"url": "http://127.0.0.1:9/", "headers": {"X": "a\nb"}}
        )
    )
    with pytest.raises(PermanentProviderError) as info:
        provider.send(message())
    assert info.value.kind == "invalid_request"
