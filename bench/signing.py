"""``python -m bench.signing``: what a webhook signature costs per request, against an unsigned one.

Two measures in one run:

* the signing step alone (``Signer.headers`` on the benchmark's ~100-byte body, and on a 16 KiB one),
  in µs per request, for no secret, one ``whsec_`` secret, two (a rotation's overlap) and the legacy
  ``X-Signature``, timed with ``timeit`` (best of ``--repeat`` runs);
* the whole ``WebhookProvider.send_async`` against the benchmark's receiver (``bench.sink``, its own
  process): the client's CPU per request unsigned and signed, interleaved over ``--rounds`` rounds
  (medians), so the difference is the signature's share of a real request.

Figures move between machines and runs: compare the ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import statistics
import subprocess
import sys
import timeit
import uuid
from typing import Any

from bench.http_clients import ROOT, configure_django, drive

SECRET_A = "whsec_" + base64.b64encode(bytes(range(32))).decode()
SECRET_B = "whsec_" + base64.b64encode(bytes(range(32, 64))).decode()
VARIANTS: dict[str, dict[str, Any]] = {
    "unsigned": {},
    "whsec_ x1": {"secret": SECRET_A},
    "whsec_ x2 (rotation)": {"secrets": [SECRET_A, SECRET_B]},
    "legacy X-Signature": {"secret": "legacy-secret"},
}


def signing_alone(repeat: int, number: int) -> None:
    from notifications_retry.providers.webhook import Signer

    print("## The signing step alone (Signer.headers), µs per request\n")
    print("| secrets | 100 B body | 16 KiB body |")
    print("|---|---:|---:|")
    msg_id = str(uuid.uuid4())
    bodies = [b'{"notification_id":"%s","payload":{"text":"hi"}}' % msg_id.encode(), b"x" * 16384]
    for name, options in VARIANTS.items():
        signer = Signer.of(options)
        cells = []
        for body in bodies:
            best = min(
                timeit.repeat(
                    lambda signer=signer, body=body: (
                        signer.headers(msg_id, 1_800_000_000, body) if signer.signs else None
                    ),
                    repeat=repeat,
                    number=number,
                )
            )
            cells.append(f"{1e6 * best / number:.2f}")
        print(f"| {name} | {cells[0]} | {cells[1]} |", flush=True)


def provider_client(options: dict[str, Any]) -> Any:
    async def client(url: str, concurrency: int) -> Any:
        from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
        from notifications_retry.providers.webhook import WebhookProvider

        channel = ChannelSettings("hook", "webhook", 10.0, concurrency, {"url": url, **options})
        provider = WebhookProvider(channel)
        message = OutgoingMessage(uuid.uuid4(), None, "hook", "r", {"text": "hi"}, 1, 5, "transactional")

        async def post() -> None:
            await provider.send_async(message)

        async def close() -> None:
            provider.close()
            await asyncio.sleep(0.05)

        return post, close

    return client


def whole_requests(requests: int, concurrency: int, rounds: int, delay: float) -> None:
    sink = subprocess.Popen(
        [sys.executable, "-m", "bench.sink", "--delay", str(delay)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    try:
        assert sink.stdout is not None
        url = f"http://127.0.0.1:{int(sink.stdout.readline())}/hook"
        print(
            f"\n## WebhookProvider.send_async, {requests} POSTs, {concurrency} in flight, receiver "
            f"answering in {delay * 1000:g} ms; client CPU per request (median of {rounds} rounds)\n"
        )
        print("| secrets | CPU/request | extra vs unsigned | req/s |")
        print("|---|---:|---:|---:|")
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
        for _ in range(rounds):  # interleaved: a busy moment of the machine hits every variant
            for name, options in VARIANTS.items():
                runs[name].append(asyncio.run(drive(provider_client(options), url, requests, concurrency)))
        base: float | None = None
        for name in VARIANTS:
            cpu = statistics.median(r["cpu_us"] for r in runs[name])
            rps = statistics.median(r["rps"] for r in runs[name])
            base = cpu if base is None else base
            print(
                f"| {name} | {cpu:,.0f} µs | {cpu - base:+,.1f} µs ({cpu / base:.3f}x) | {rps:,.0f} |",
                flush=True,
            )
    finally:
        sink.terminate()
        sink.wait(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args(argv)
    configure_django()
    signing_alone(args.repeat, args.number)
    whole_requests(args.requests, args.concurrency, args.rounds, args.delay)


if __name__ == "__main__":
    main()
