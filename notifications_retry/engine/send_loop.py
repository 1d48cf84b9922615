"""The worker's event loop, on a thread of its own: where every provider call in flight waits.

The worker's own thread claims and finalizes (Django's ORM is synchronous); sends run here, as
tasks on one loop, so a hundred calls in flight cost a hundred coroutines, not a hundred threads
contending for the GIL.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable
from typing import Any

__all__ = ["SendLoop"]


class SendLoop:
    """An asyncio loop running on a daemon thread until :meth:`close`."""

    def __init__(self, name: str = "notifications-retry-send-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Stopped by close(): start what was spawned meanwhile, cancel what is left, let
            # transports finish closing, then close.
            self.loop.run_until_complete(asyncio.sleep(0))
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                self.loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    def spawn(self, coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
        """Start the coroutines as tasks on the loop (one wake-up of the loop for all of them)."""
        batch = list(coroutines)
        if batch:
            self.loop.call_soon_threadsafe(self._start, batch)

    def _start(self, batch: list[Coroutine[Any, Any, None]]) -> None:
        for coroutine in batch:
            task = self.loop.create_task(coroutine)
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop; tasks still running are cancelled."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
