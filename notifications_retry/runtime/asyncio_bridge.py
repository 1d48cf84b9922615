"""Synchronous code meeting asynchronous code: the app's loops and its one sync-to-async call.

- :func:`run_sync` runs a coroutine to completion from synchronous code (``api.send_now``, a webhook
  provider's ``send``): on a new loop, or on a short-lived thread when this thread runs a loop already.
- :class:`SteppedLoop` is an event loop its owner's thread runs in steps, between its own synchronous
  work: the worker's sends live there, on the worker's own thread (the tick's state has one owner).
- :class:`LoopThread` keeps an event loop running on a daemon thread: the asynchronous broker clients
  of the outbox relay (called and waited for) live there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar

_T = TypeVar("_T")

#: How long :meth:`LoopThread.stop` waits for cancelled tasks to run out and for the thread to end.
STOP_TIMEOUT_SECONDS = 5.0


def run_sync(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run ``coroutine`` to completion from synchronous code, on a new event loop.

    A thread that already runs a loop (a notebook, a Playwright session, an async framework's
    thread) cannot start another: the coroutine then runs on a short-lived thread of its own.
    """
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is None:  # outside the except block: a failure of the coroutine is not chained to it
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="notifications-retry-sync") as pool:
        return pool.submit(asyncio.run, coroutine).result()


class SteppedLoop:
    """An event loop run only by the thread that owns it, in steps: while it waits for an event or a pause.

    Its tasks progress while the owner waits (:meth:`wait`, :meth:`pause`); between steps the owner
    runs synchronous code (Django's ORM refuses to run inside a running loop) and the tasks stand
    still. Everything they change is therefore changed on the owner's thread: it needs no lock.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        # Spawned tasks: the loop keeps only weak references to tasks.
        self._tasks: set[asyncio.Task[Any]] = set()
        # Set by signal() and cleared by the wait it ends: a signal between two waits is not lost.
        self._event = asyncio.Event()

    def _started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._event = asyncio.Event()  # an event is bound to the first loop that waits on it
        return self._loop

    def spawn(self, coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
        """Make the coroutines tasks of the loop; they start at its next step."""
        for coroutine in coroutines:
            self.start(coroutine)

    def start(self, coroutine: Coroutine[Any, Any, _T]) -> asyncio.Future[_T]:
        """Make ``coroutine`` a task of the loop, which starts at its next step; the owner takes its
        result later with :meth:`run`."""
        loop = self._started()
        task = loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def signal(self) -> None:
        """Called by a task: end the owner's current :meth:`wait` (or its next one): the task has
        something to hand over."""
        self._event.set()

    def wait(self, timeout: float) -> None:
        """Run the loop until a task calls :meth:`signal` or ``timeout`` seconds pass."""
        self._started().run_until_complete(self._wait(timeout))

    async def _wait(self, timeout: float) -> None:
        if not self._event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), max(0.0, timeout))
        self._event.clear()

    def pause(self, seconds: float) -> None:
        """Run the loop for ``seconds`` (the owner's pause: the tasks go on meanwhile)."""
        self._started().run_until_complete(asyncio.sleep(max(0.0, seconds)))

    def run(self, work: Coroutine[Any, Any, _T] | asyncio.Future[_T]) -> _T:
        """Run the loop until ``work`` (a coroutine, or a task :meth:`start` made) is done; its result."""
        return self._started().run_until_complete(work)

    def close(self) -> None:
        """Cancel what still runs on the loop, let it run out (transports closed), and close the loop."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        with contextlib.suppress(Exception):
            loop.run_until_complete(self._finish())
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        self._tasks.clear()

    async def _finish(self) -> None:
        """Cancel the spawned tasks (calls still in flight); let the others (a client's close) end."""
        await _cancel_pending(first=list(self._tasks), grace=STOP_TIMEOUT_SECONDS)


class LoopThread:
    """An event loop on a daemon thread of its own, started at the first call (again after :meth:`stop`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Spawned tasks: the loop keeps only weak references to tasks.
        self._tasks: set[asyncio.Task[Any]] = set()

    def _started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None or self._thread is None or not self._thread.is_alive():
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name=self.name, daemon=True)
            self._thread.start()
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, _T], timeout: float) -> _T:
        """The coroutine's result; TimeoutError (the coroutine cancelled) after ``timeout`` seconds."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._started())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout:g}s") from None

    def spawn(self, coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
        """Start the coroutines as tasks on the loop, without waiting (one wake-up of the loop for all)."""
        batch = list(coroutines)
        if batch:
            self._started().call_soon_threadsafe(self._start, batch)

    def _start(self, batch: list[Coroutine[Any, Any, None]]) -> None:
        loop = asyncio.get_running_loop()
        for coroutine in batch:
            task = loop.create_task(coroutine)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Cancel what still runs on the loop and let it run out, then stop the loop and join its thread."""
        loop, thread = self._loop, self._thread
        self._loop, self._thread = None, None
        if loop is None or thread is None:
            return
        if thread.is_alive():
            # Whatever was spawned, or a client library left scheduled, is cancelled and run out (its
            # transports closed), not dropped half-started with the loop.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(STOP_TIMEOUT_SECONDS)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(STOP_TIMEOUT_SECONDS)
        if not thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.close()


async def _cancel_pending(first: list[asyncio.Task[Any]] | None = None, grace: float = 0.0) -> None:
    """Cancel the loop's tasks and let them run out: ``first`` at once, the others after ``grace``
    seconds to end on their own (a client closing its connections)."""
    await asyncio.sleep(0)  # tasks spawned just before the stop start first
    for task in first or ():
        task.cancel()
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if tasks and grace > 0:
        await asyncio.wait(tasks, timeout=grace)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0)  # transports finish closing


__all__ = ["LoopThread", "SteppedLoop", "run_sync"]


# --------------------------------------------------------------------------------------------------
# A deadline over an awaited call that does not mistake a paused process for a slow answer.
#
# ``asyncio.timeout`` fires as soon as the loop runs again after its time has passed. When the process did
# not run meanwhile (SIGSTOP, a paused VM, a starved machine), an answer that arrived during the pause is
# already waiting in the socket, but the timer runs first and the call counts as a timeout. Here a deadline
# whose timer fires more than :data:`LATE_SECONDS` late is given :data:`GRACE_SECONDS` more, once, so what
# already came back is read; a call that never answers still ends, that much later.
# --------------------------------------------------------------------------------------------------

#: A timer this late means the process (or its loop) did not run around the deadline.
LATE_SECONDS = 0.5
#: Time given, once, to read what arrived while the process did not run.
GRACE_SECONDS = 0.25


class Deadline:
    """``async with``: like ``asyncio.timeout(seconds)`` (raises ``TimeoutError``), but a late timer gives
    a grace once. A class rather than a generator-based context manager: one is entered per send."""

    __slots__ = ("_due", "_extended", "_handle", "_loop", "_scope", "_seconds")

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    async def __aenter__(self) -> asyncio.Timeout:
        loop = self._loop = asyncio.get_running_loop()
        scope = self._scope = asyncio.timeout(None)
        await scope.__aenter__()
        self._due = loop.time() + self._seconds
        self._extended = False
        self._handle = loop.call_at(self._due, self._fire)
        return scope

    def _fire(self) -> None:
        now = self._loop.time()
        if not self._extended and now - self._due > LATE_SECONDS:
            self._extended, self._due = True, now + GRACE_SECONDS
            self._handle = self._loop.call_at(self._due, self._fire)
            return
        self._scope.reschedule(now)  # expire: the awaited call is cancelled, TimeoutError on exit

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._handle.cancel()
        await self._scope.__aexit__(exc_type, exc, tb)


def deadline(seconds: float) -> Deadline:
    """A deadline of ``seconds`` from when it is entered (see :class:`Deadline`)."""
    return Deadline(seconds)
