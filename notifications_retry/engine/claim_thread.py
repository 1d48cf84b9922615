"""A second claimer: a thread and a database connection that run claims beside the worker's own.

An inline provider's outcome is written by its claim's own transaction (one row write, no lease). On
one thread the worker's Python (reading the claimed rows, settling them, reporting the outcomes) and
the server's work (the claim, the outcome and event writes, the commit) take turns, so of a 2-core
machine one core is idle at any moment. With a backlog of inline rows the dispatcher keeps one claim
running here while it runs the next on its own connection: while one thread waits for its statements
the other's Python runs. ``SKIP LOCKED`` keeps the two claims' rows apart.

Only the claim itself runs here; what it returned is absorbed (queued, counted, reported) on the
worker's thread, so the tick's stats and the reporter need no lock.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from django.db import connection

from notifications_retry.delivery.session import drop_broken_connection

T = TypeVar("T")

#: How long :meth:`ClaimThread.close` waits for a claim under way and the connection's close.
CLOSE_TIMEOUT_SECONDS = 30.0


class ClaimThread:
    """One worker thread (started on first use) whose claims run on its own Django connection."""

    def __init__(self, *, name: str = "notifications-retry-claimer") -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._broken = False

    @property
    def started(self) -> bool:
        return self._pool is not None

    def submit(self, claim: Callable[[], T]) -> Future[T]:
        """Run ``claim`` on the thread; its result, or what it raised, comes back through the future."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._name)
        return self._pool.submit(self._run, claim)

    def _run(self, claim: Callable[[], T]) -> T:
        if self._broken:
            # Only after a failure: checking a healthy connection costs a round trip per claim.
            drop_broken_connection()
            self._broken = False
        try:
            return claim()
        except BaseException:
            self._broken = True
            raise

    def close(self) -> None:
        """Close the thread's connection and end the thread (a tick ends with no session left open)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            pool.submit(_close_connection).result(CLOSE_TIMEOUT_SECONDS)
        finally:
            pool.shutdown(wait=True)
        self._broken = False


def _close_connection() -> None:
    # Resolved on the claim thread: ``connection`` is a per-thread proxy.
    connection.close()
