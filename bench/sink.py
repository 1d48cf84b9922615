"""A webhook receiver for the benchmark: answers every POST ``--delay`` seconds after it arrived.

Runs in its own process (asyncio, keep-alive HTTP/1.1, httptools' parser), so the receiver's CPU
does not share the worker's GIL. Event-loop timers fire late (epoll counts in milliseconds, and the
machine is busy with the worker and PostgreSQL): the receiver measures how late its answers went
out and aims that much earlier, so the delay it promises is the delay it gives on average.
``GET /stats`` returns the arrival time (``time.time()``) of every POST since the last
``GET /reset``, and the mean and 99th percentile of the time from arrival to answer; ``GET /keys``
returns how many POSTs arrived with each ``Idempotency-Key`` (the crash benchmark counts duplicates).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import httptools

_OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"id":"sink-1"}'


class _Receiver:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.arrivals: list[float] = []
        self.answer_times: list[float] = []
        self.lateness = 0.0  # moving average of how late a timer fires
        self.keys: dict[str, int] = {}
        self.first: dict[str, float] = {}  # each key's first arrival (time.time()): lateness

    def reset(self) -> None:
        self.arrivals, self.answer_times, self.keys, self.first = [], [], {}, {}

    def stats(self) -> bytes:
        times = sorted(self.answer_times)
        return json.dumps(
            {
                "arrivals": self.arrivals,
                "answer_ms_mean": 1000 * sum(times) / len(times) if times else 0.0,
                "answer_ms_p99": 1000 * times[int(0.99 * (len(times) - 1))] if times else 0.0,
            }
        ).encode()


class _Connection(asyncio.Protocol):
    def __init__(self, receiver: _Receiver) -> None:
        self.receiver = receiver
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.header_name = b""
        self.idempotency_key = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url
        self.idempotency_key = ""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"idempotency-key":
            self.idempotency_key = value.decode("latin-1")

    def on_message_complete(self) -> None:
        receiver = self.receiver
        if self.parser.get_method() != b"POST":
            if self.url == b"/stats":
                self._write_json(receiver.stats())
            elif self.url == b"/count":
                self._write_json(b'{"count": %d}' % len(receiver.arrivals))
            elif self.url == b"/keys":
                self._write_json(json.dumps(receiver.keys).encode())
            elif self.url == b"/first":
                self._write_json(json.dumps(receiver.first).encode())
            else:
                receiver.reset()
                self._write_json(b"{}")
            return
        loop = asyncio.get_running_loop()
        arrived, arrived_loop = time.time(), loop.time()
        receiver.arrivals.append(arrived)
        if self.idempotency_key:
            receiver.keys[self.idempotency_key] = receiver.keys.get(self.idempotency_key, 0) + 1
            receiver.first.setdefault(self.idempotency_key, arrived)
        due = arrived_loop + receiver.delay
        loop.call_at(due - receiver.lateness, self._answer, due, arrived_loop)

    def _answer(self, due: float, arrived_loop: float) -> None:
        receiver = self.receiver
        now = asyncio.get_running_loop().time()
        receiver.lateness = max(0.0, 0.99 * receiver.lateness + 0.01 * (now - due + receiver.lateness))
        receiver.answer_times.append(now - arrived_loop)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_OK)

    def _write_json(self, body: bytes) -> None:
        assert self.transport is not None
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        self.transport.write(head % len(body) + body)


async def _main(port: int, delay: float) -> None:
    receiver = _Receiver(delay)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Connection(receiver), "127.0.0.1", port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """Serve until killed; prints the bound port on the first line of stdout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.02)
    args = parser.parse_args(argv)
    try:
        asyncio.run(_main(args.port, args.delay))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
