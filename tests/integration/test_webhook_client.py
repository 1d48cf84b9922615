"""The webhook's kept HTTP client (aiohttp) against raw servers on 127.0.0.1: reuse, framing, limits.

Every case goes through ``WebhookProvider`` as the worker does (``send_async`` on one loop, or ``send``),
so what is asserted is the outcome a record gets: Sent, or a classified ``ProviderError``.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import tracemalloc
import uuid
from collections.abc import Coroutine
from typing import Any

import pytest

from notifications_retry.exceptions import PermanentProviderError, ProviderError, RetryableProviderError
from notifications_retry.providers import http_client
from notifications_retry.providers.base import ChannelSettings, OutgoingMessage, SendResult
from notifications_retry.providers.webhook import MAX_RESPONSE_BYTES, WebhookProvider
from notifications_retry.runtime.asyncio_bridge import run_sync
from tests.conftest import allow_loopback
from tests.support.raw_http_server import (
    OK,
    RawServer,
    drip,
    endless,
    keep_alive,
    never_answer,
    one_answer_then_close,
)

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    allow_loopback(settings)


def provider_for(url: str, timeout: float = 2.0, concurrency: int = 4, **options: Any) -> WebhookProvider:
    return WebhookProvider(
        ChannelSettings("webhook", "webhook", timeout, concurrency, {"url": url, **options})
    )


def message() -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), None, "webhook", "+33600000000", {"n": 1}, 1, 5, "transactional")


def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    # run_sync: the browser tests leave a running loop in this thread (Playwright's sync API).
    return run_sync(asyncio.wait_for(coroutine, 30))


def send_async_all(provider: WebhookProvider, count: int) -> list[SendResult | BaseException]:
    async def scenario() -> list[SendResult | BaseException]:
        try:
            return await asyncio.gather(
                *[provider.send_async(message()) for _ in range(count)], return_exceptions=True
            )
        finally:
            provider.close()
            await asyncio.sleep(0.01)

    return run(scenario())


# -- connections -----------------------------------------------------------------------------------


def test_kept_alive_connection_is_reused_and_the_request_is_framed():
    with RawServer(keep_alive()) as server:
        provider = provider_for(server.url + "?x=1", headers={"X-A": "1"})

        async def three() -> list[str | None]:
            try:
                return [(await provider.send_async(message())).provider_message_id for _ in range(3)]
            finally:
                provider.close()

        assert run(three()) == ["a1", "a1", "a1"]
        assert server.connections == 1
        first = server.requests[0]
        assert first.startswith(b"POST /hook?x=1 HTTP/1.1\r\n")
        head = first.split(b"\r\n\r\n")[0].lower()
        assert b"\r\nx-a: 1" in head and b"\r\nidempotency-key: " in head
        assert b"\r\ncontent-type: application/json" in head
        assert b"accept-encoding" not in head  # answers are not decompressed: none is asked for


def test_connection_the_server_dropped_while_idle_is_replaced():
    with RawServer(one_answer_then_close()) as server:
        provider = provider_for(server.url)

        async def two() -> None:
            try:
                await provider.send_async(message())
                await asyncio.sleep(0.1)  # the server has closed the kept-alive connection meanwhile
                await provider.send_async(message())
            finally:
                provider.close()

        run(two())
        assert server.connections == 2 and len(server.requests) == 2


def test_connection_close_answer_is_not_reused():
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    with RawServer(keep_alive(answer)) as server:
        provider = provider_for(server.url)

        async def two() -> None:
            try:
                for _ in range(2):
                    await provider.send_async(message())
            finally:
                provider.close()

        run(two())
        assert server.connections == 2


def test_at_most_max_concurrency_connections_are_open():
    with RawServer(keep_alive(delay=0.05)) as server:
        results = send_async_all(provider_for(server.url, concurrency=3), 12)
        assert [r.provider_message_id for r in results] == ["a1"] * 12  # type: ignore[union-attr]
        assert server.most_open <= 3 and server.connections <= 3


def test_close_from_another_thread_lets_the_call_in_flight_finish():
    with RawServer(keep_alive(delay=0.3)) as server:
        provider = provider_for(server.url)

        async def scenario() -> SendResult:
            task = asyncio.ensure_future(provider.send_async(message()))
            await asyncio.sleep(0.1)
            # The worker closes a provider whose channel changed from its own thread.
            await asyncio.get_running_loop().run_in_executor(None, provider.close)
            return await task

        assert run(scenario()).provider_message_id == "a1"


def test_sync_send_works_where_a_loop_already_runs():
    with RawServer(keep_alive()) as server:
        provider = provider_for(server.url)
        results = []

        async def inside_a_loop() -> None:
            # As from a notebook cell or an async framework's thread: this thread's loop is running.
            results.append(provider.send(message()).provider_message_id)

        run(inside_a_loop())
        assert results == ["a1"] and len(server.requests) == 1


def test_provider_serves_a_new_event_loop_after_the_first_one_closed():
    with RawServer(keep_alive()) as server:
        provider = provider_for(server.url)
        for _ in range(2):
            assert run(provider.send_async(message())).provider_message_id == "a1"
        provider.close()


def test_no_proxy_is_taken_from_the_environment(monkeypatch):
    with RawServer(keep_alive()) as proxy, RawServer(keep_alive()) as server:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, proxy.url.rsplit("/", 1)[0])
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert provider_for(server.url).send(message()).provider_message_id == "a1"
        assert len(server.requests) == 1 and proxy.connections == 0


# -- answers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "message_id"),
    [
        (
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{"id\r\n6\r\n":"c"}\r\n0\r\n\r\n',
            "c",
        ),
        (b'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 8\r\n\r\n{"id":2}', "2"),
        (b'HTTP/1.0 200 OK\r\n\r\n{"id":"until-close"}', "until-close"),
    ],
    ids=["chunked", "interim-100", "close-delimited"],
)
def test_answer_framings(answer, message_id):
    with RawServer(one_answer_then_close(answer)) as server:
        assert provider_for(server.url).send(message()).provider_message_id == message_id


def test_oversized_body_is_cut_and_its_connection_dropped():
    big = b'{"id":"big","pad":"' + b"x" * (MAX_RESPONSE_BYTES * 4) + b'"}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)
    with RawServer(keep_alive(answer)) as server:
        results = send_async_all(provider_for(server.url, concurrency=1), 2)
        # Sent (2xx), without an id: a cut body is not parsed.
        assert [r.provider_message_id for r in results] == [None, None]  # type: ignore[union-attr]
        assert server.connections == 2  # the half-read connection was not reused


@pytest.mark.parametrize(
    "answer",
    [b"SMTP ready\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort", b""],
    ids=["not-http", "cut-short", "closed-without-answer"],
)
def test_malformed_or_cut_answers_are_retriable_transport_failures(answer):
    with RawServer(one_answer_then_close(answer)) as server:
        with pytest.raises(RetryableProviderError) as info:
            provider_for(server.url).send(message())
        assert info.value.kind == "transport"
        assert info.value.__cause__ is not None


def test_dripping_server_is_cut_off_at_the_whole_request_deadline():
    with RawServer(drip(OK, per_second=1)) as server:
        started = time.monotonic()
        with pytest.raises(RetryableProviderError) as info:
            provider_for(server.url, timeout=1.0).send(message())
        assert info.value.kind == "timeout"
        assert time.monotonic() - started < 2.0


def test_server_that_never_answers_times_out():
    with RawServer(never_answer) as server:
        started = time.monotonic()
        with pytest.raises(RetryableProviderError) as info:
            provider_for(server.url, timeout=0.5).send(message())
        assert info.value.kind == "timeout"
        assert time.monotonic() - started < 1.5


def test_refused_connection_is_retriable():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(RetryableProviderError) as info:
        provider_for(f"http://127.0.0.1:{port}/").send(message())
    assert info.value.kind == "connection"


# -- hostile headers: capped, classified, bounded in time and memory ---------------------


HEADER_FLOODS = {
    # One header line of 50 MB: over the per-field limit after 8 KiB.
    "one-50MB-header": (b"HTTP/1.1 200 OK\r\nX-Big: ", b"a" * 65536, 50 * MB),
    # The same name a million times: over the header-count limit after 128.
    "repeated-name": (b"HTTP/1.1 503 Busy\r\n", b"Retry-After: 1\r\n" * 4096, 50 * MB),
    # Many distinct headers just under the field limit.
    "many-8KiB-headers": (b"HTTP/1.1 200 OK\r\n", b"X-Pad: " + b"p" * 8000 + b"\r\n", 50 * MB),
    # A status line of 50 MB.
    "50MB-status-line": (b"HTTP/1.1 200 ", b"O" * 65536, 50 * MB),
}


@pytest.mark.parametrize("flood", HEADER_FLOODS, ids=list(HEADER_FLOODS))
def test_header_floods_are_refused_quickly_without_buffering_them(flood):
    head, chunk, total = HEADER_FLOODS[flood]
    with RawServer(endless(head, chunk, total)) as server:
        gc.collect()
        tracemalloc.start()
        try:
            started = time.monotonic()
            with pytest.raises(RetryableProviderError) as info:
                provider_for(server.url, timeout=10.0).send(message())
            elapsed = time.monotonic() - started
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert info.value.kind == "transport"
    assert "oversized" in str(info.value) or "malformed" in str(info.value)
    assert elapsed < 3.0
    # The 50 MB never sit in memory: what is held is the parser's limits plus buffers.
    assert peak < 8 * MB, f"peak {peak / MB:.1f} MB"


def test_header_limits_are_the_documented_ones():
    assert http_client.MAX_HEADER_FIELD_BYTES == 8190
    assert http_client.MAX_HEADERS == 128
    assert http_client.MAX_STATUS_LINE_BYTES == 8190


def test_headers_at_the_limits_are_accepted():
    fields = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(100))
    answer = b'HTTP/1.1 200 OK\r\n%sContent-Length: 8\r\n\r\n{"id":1}' % fields
    with RawServer(one_answer_then_close(answer)) as server:
        assert provider_for(server.url).send(message()).provider_message_id == "1"


# -- requests that cannot be sent ------------------------------------------------------------------


def test_invalid_headers_in_options_are_described_and_never_sent():
    problems = WebhookProvider.options_problems(
        {
            "url": "https://hooks.example.com/x y",
            "headers": {"X-A": "1\r\nX-B: 2", "Host": "other", "Content-Length": "9"},
        }
    )
    assert any("spaces or control characters" in p for p in problems)
    problems = WebhookProvider.options_problems(
        {
            "url": "https://hooks.example.com/x",
            "headers": {"X-A": "1\r\nX-B: 2", "Host": "o", "Content-Length": "9"},
        }
    )
    assert any("'X-A'" in p and "character" in p for p in problems)
    assert any("'Host'" in p and "set by the provider" in p for p in problems)
    assert any("'Content-Length'" in p for p in problems)
    with RawServer(keep_alive()) as server:
        with pytest.raises(PermanentProviderError) as info:
            provider_for(server.url, headers={"X": "a\nb"}).send(message())
        assert info.value.kind == "invalid_request"
        assert server.connections == 0


def test_any_exception_inside_the_client_becomes_a_retriable_error_with_its_cause(monkeypatch):
    async def explode(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("client bug")

    monkeypatch.setattr(http_client.HttpClient, "request", explode)
    with RawServer(keep_alive()) as server:
        provider = provider_for(server.url)
        with pytest.raises(ProviderError) as info:
            provider.send(message())
        assert info.value.retriable and info.value.kind == "provider_crash"
        assert isinstance(info.value.__cause__, RuntimeError)

        async def once() -> None:
            try:
                await provider.send_async(message())
            finally:
                provider.close()

        with pytest.raises(ProviderError):
            run(once())
