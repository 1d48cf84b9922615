"""A deadline does not mistake a paused process for a slow answer (runtime.asyncio_bridge.deadline)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from notifications_retry.runtime.asyncio_bridge import deadline


def _read_after_a_pause(scope: Callable[[float], Any], *, answer: bool) -> bytes:
    """Await an answer under a 0.2 s deadline while the loop is held up for 0.6 s (a SIGSTOP of the
    process, as the loop sees it); the answer, if any, arrives in the socket during the pause."""
    ours, theirs = socket.socketpair()

    async def main() -> bytes:
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(sock=ours)

        def frozen() -> None:
            if answer:
                threading.Timer(0.1, theirs.sendall, [b"200 OK"]).start()
            time.sleep(0.6)

        loop.call_later(0.05, frozen)
        try:
            async with scope(0.2):
                return await reader.read(100)
        finally:
            writer.close()

    try:
        return asyncio.run(main())
    finally:
        theirs.close()


def test_an_answer_that_arrived_while_the_process_did_not_run_counts():
    assert _read_after_a_pause(deadline, answer=True) == b"200 OK"


def test_asyncio_timeout_alone_would_call_it_a_timeout():
    # What the deadline guards against: the timer runs before the waiting read does.
    with pytest.raises(TimeoutError):
        _read_after_a_pause(asyncio.timeout, answer=True)


def test_no_answer_still_times_out_after_the_grace():
    with pytest.raises(TimeoutError):
        _read_after_a_pause(deadline, answer=False)
