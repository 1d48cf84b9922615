"""``python -m bench.http_clients``: the kept HTTP clients the webhook could use, in one run.

Drives ``--requests`` POSTs, ``--concurrency`` at a time, against the benchmark's receiver
(``bench.sink``, its own process, answering each POST ``--delay`` seconds after it arrived), with:

* ``aiohttp``: one ``ClientSession`` (``TCPConnector(limit=concurrency)``), driven directly;
* ``httpx+aiohttp``: an ``httpx.AsyncClient`` on the ``httpx-aiohttp`` transport (the same aiohttp
  session underneath, httpx's request and response models on top);
* ``httpx``: a plain ``httpx.AsyncClient`` (httpcore's pool), for reference;
* ``webhook``: the product's ``WebhookProvider.send_async`` (aiohttp, plus the URL policy on every
  send, the connect-time guard, the deadline and the capped read).

For each it prints requests/s, the share of the latency bound (``concurrency / delay``) and the
client's CPU per request (medians of ``--rounds`` interleaved rounds), with the ratios to the first
client measured in the same run: figures move between machines and runs; compare only the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BODY = b'{"notification_id":"00000000-0000-0000-0000-000000000000","payload":{"text":"hi"}}'
HEADERS = {"Content-Type": "application/json", "Idempotency-Key": "00000000-0000-0000-0000-000000000000"}

Post = Callable[[], Awaitable[None]]
Client = Callable[[str, int], Awaitable[tuple[Post, Callable[[], Awaitable[None]]]]]


async def aiohttp_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

    async def post() -> None:
        async with session.post(url, data=BODY, headers=HEADERS) as response:
            await response.read()
            assert response.status == 200

    return post, session.close


async def httpx_aiohttp_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    import httpx
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(transport=AiohttpTransport(limits=limits, trust_env=False), trust_env=False)

    async def post() -> None:
        response = await client.post(url, content=BODY, headers=HEADERS)
        assert response.status_code == 200

    return post, client.aclose


async def httpx_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = httpx.AsyncClient(limits=limits, trust_env=False)

    async def post() -> None:
        response = await client.post(url, content=BODY, headers=HEADERS)
        assert response.status_code == 200

    return post, client.aclose


async def webhook_client(url: str, concurrency: int) -> tuple[Post, Callable[[], Awaitable[None]]]:
    from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
    from notifications_retry.providers.webhook import WebhookProvider

    provider = WebhookProvider(ChannelSettings("hook", "webhook", 10.0, concurrency, {"url": url}))
    message = OutgoingMessage(uuid.uuid4(), None, "hook", "r", {"text": "hi"}, 1, 5, "transactional")

    async def post() -> None:
        await provider.send_async(message)

    async def close() -> None:
        provider.close()
        await asyncio.sleep(0.05)

    return post, close


CLIENTS: dict[str, Client] = {
    "aiohttp": aiohttp_client,
    "httpx+aiohttp": httpx_aiohttp_client,
    "httpx": httpx_client,
    "webhook": webhook_client,
}


async def drive(client: Client, url: str, requests: int, concurrency: int) -> dict[str, float]:
    """``requests`` POSTs, ``concurrency`` at a time; wall and CPU seconds after a warm-up."""
    post, close = await client(url, concurrency)
    try:
        await asyncio.gather(*[post() for _ in range(concurrency)])  # open the connections
        remaining = requests

        async def lane() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await post()

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*[lane() for _ in range(concurrency)])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await close()
    return {"rps": requests / wall, "cpu_us": 1e6 * cpu / requests}


def configure_django() -> None:
    """The provider reads NOTIFICATIONS_RETRY (the receiver's loopback address is allowlisted)."""
    from django.conf import settings

    if not settings.configured:
        settings.configure(NOTIFICATIONS_RETRY={"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}, USE_TZ=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 32])
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--clients", nargs="+", choices=list(CLIENTS), default=list(CLIENTS))
    parser.add_argument(
        "--rounds", type=int, default=3, help="Rounds of every client, interleaved; the median is printed."
    )
    args = parser.parse_args(argv)
    configure_django()
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.sink", "--delay", str(args.delay)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    try:
        assert sink.stdout is not None
        url = f"http://127.0.0.1:{int(sink.stdout.readline())}/hook"
        print(f"{args.requests} POSTs against a receiver answering in {args.delay * 1000:g} ms ({url})")
        for concurrency in args.concurrency:
            bound = concurrency / args.delay
            print(f"\n## {concurrency} in flight (latency bound {bound:,.0f} req/s)\n")
            print("| client | req/s | of bound | ratio | CPU/request | ratio |")
            print("|---|---:|---:|---:|---:|---:|")
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.clients}
            for _ in range(args.rounds):  # interleaved, so a busy moment of the machine hits every client
                for name in args.clients:
                    runs[name].append(asyncio.run(drive(CLIENTS[name], url, args.requests, concurrency)))
            first: dict[str, float] | None = None
            for name in args.clients:
                result = {key: statistics.median(r[key] for r in runs[name]) for key in ("rps", "cpu_us")}
                first = first or result
                print(
                    f"| {name} | {result['rps']:,.0f} | {100 * result['rps'] / bound:.0f} % "
                    f"| {result['rps'] / first['rps']:.2f} | {result['cpu_us']:,.0f} µs "
                    f"| {result['cpu_us'] / first['cpu_us']:.2f} |",
                    flush=True,
                )
    finally:
        sink.terminate()
        sink.wait(10)


if __name__ == "__main__":
    main()
