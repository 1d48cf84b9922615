"""An event loop on a daemon thread, for publishers whose broker client is asynchronous.

The relay is synchronous; aio-pika and nats-py are not. Their clients live on this loop for the
publisher's whole life, so heartbeats and pings are answered between batches as well, and the relay
hands each call over and waits for it, bounded.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


class LoopThread:
    """Runs coroutines on a loop of its own thread, started at the first call."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout: float) -> _T:
        """The coroutine's result; TimeoutError (the coroutine cancelled) after ``timeout`` seconds."""
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
            self._thread.start()
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout:g}s") from None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop the loop and join its thread (after the caller closed its clients on it)."""
        loop, thread = self._loop, self._thread
        self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        if thread.is_alive():
            # Whatever the client library left scheduled is cancelled and run out, not dropped
            # half-started with the loop.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(5)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
        if not thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.close()


async def _cancel_pending() -> None:
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
