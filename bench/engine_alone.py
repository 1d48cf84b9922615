"""The latency-bound drain with the HTTP taken out: what the engine alone costs a row.

``SleepProvider`` (provider key ``bench_sleep``, registered by ``bench.settings``) is an asynchronous
provider that waits ``options["delay_seconds"]`` on the send loop and answers, with no socket and no
client library. Drained at the receiver's 20 ms, it runs the worker's whole path (claims, starts, the
pacer, hand-overs, commits, log events, metrics) at the same pace as the webhook drain. Its CPU a row
beside aiohttp's alone (``bench.http_clients``) splits the webhook drain's CPU into the engine's part and
the HTTP client's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from bench.db import add_rows, channel, reset_rows
from bench.worker_drain import timed_drain_once
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult


class SleepProvider(Provider):
    """Waits ``delay_seconds`` on the running loop, then delivers: a receiver with nothing between."""

    key: ClassVar[str] = "bench_sleep"

    def __init__(self, channel: Any) -> None:
        super().__init__(channel)
        self.delay_seconds = float(channel.options.get("delay_seconds", 0.02))

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = super().options_problems(options)
        delay = options.get("delay_seconds", 0.02)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            problems.append(f"bench_sleep option 'delay_seconds' must be a number >= 0, got {delay!r}")
        return problems

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        await asyncio.sleep(self.delay_seconds)
        return SendResult(provider_message_id=f"sleep:{message.notification_id}")

    def send(self, message: OutgoingMessage) -> SendResult:
        time.sleep(self.delay_seconds)
        return SendResult(provider_message_id=f"sleep:{message.notification_id}")


def sleep_drain(rows: int, *, max_concurrency: int, delay: float = 0.02) -> dict[str, Any]:
    """Drain ``rows`` due rows of a ``bench_sleep`` channel in one ``--once`` tick; rows/s and CPU."""
    reset_rows()
    cid = channel(
        "sleep",
        "bench_sleep",
        options={"delay_seconds": delay},
        max_concurrency=max_concurrency,
        timeout_seconds=10.0,
    )
    add_rows([cid], rows)
    drained = timed_drain_once(rows)
    if drained.sent != rows:
        raise RuntimeError(f"engine-alone drain sent {drained.sent} of {rows}")
    return {
        "rows_per_s": rows / drained.elapsed,
        "cpu_us_per_row": 1e6 * drained.cpu / rows,
        "cpu_share": drained.cpu / drained.elapsed,
        "core_shares": drained.core_shares,
    }
