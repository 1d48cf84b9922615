"""The completer on a thread and a database connection of its own.

On the worker's thread a commit (about 30 ms for a batch at high concurrency) made every claim behind
it wait, so the calls in flight drained while nothing new was claimed. Here the same
:class:`~.completer.Completer` rule (size or delay, backoff through outages) runs on its own thread,
whose Django connection is its own (Django's connections are per thread): claims and commits go to
the server side by side. What a commit did is handed back to the worker's thread
(:meth:`ThreadedCompleter.deliver`), which alone counts, logs and signals outcomes, so the tick's
stats and the reporter need no lock.

The worker's thread uses it through the same calls as the inline completer (``add``, ``due``,
``commit``, ``wait_hint``, ``wait``, ``deliver``), so the dispatcher does not know which one it has.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import structlog
from django.db import connection

from notifications_retry.delivery import CommitUnavailable, FinalizeReport
from notifications_retry.delivery.session import drop_broken_connection
from notifications_retry.engine.completer import Completer
from notifications_retry.outcomes import Outcome

log = structlog.get_logger("notifications_retry.worker")

#: The longest the commit thread sleeps without looking at its state again (a backstop: every
#: change it waits for also wakes it).
IDLE_WAKE_SECONDS = 1.0
#: A thread with nothing to commit for this long ends, closing its connection (the next outcome starts
#: another): a looping worker between ticks, or one a test forgot to close, holds no idle session.
IDLE_EXIT_SECONDS = 5.0
#: How long :meth:`ThreadedCompleter.close` waits for a commit under way.
CLOSE_TIMEOUT_SECONDS = 10.0


class ThreadedCompleter:
    """Runs a :class:`Completer`'s commits on a daemon thread; reports are delivered on the caller's."""

    def __init__(self, completer: Completer, *, name: str = "notifications-retry-completer") -> None:
        self._completer = completer
        self._on_report = completer.on_report
        self._reports: collections.deque[FinalizeReport] = collections.deque()
        completer.on_report = self._reports.append  # the thread only queues; deliver() reports
        self._cond = threading.Condition()
        self._committing = 0  # outcomes of the batch being committed right now
        self._flush = False
        self._error: BaseException | None = None
        self._name = name
        # Started by the first outcome (a worker built and never run holds no thread, no connection)
        # and again after close(): a worker's run() closes it, and a test may run a worker twice.
        self._thread: threading.Thread | None = None

    # -- what the worker's thread calls ---------------------------------------------------------

    @property
    def pending(self) -> int:
        """Outcomes not committed yet, counting the batch being committed."""
        with self._cond:
            return self._completer.pending + self._committing

    @property
    def unavailable(self) -> bool:
        return self._completer.unavailable

    @property
    def bound(self) -> Any:
        """The logger of the tick under way (the completer's): the thread logs outages with its run id."""
        return self._completer.bound

    @bound.setter
    def bound(self, value: Any) -> None:
        self._completer.bound = value

    def add(self, outcomes: Iterable[Outcome]) -> None:
        new = list(outcomes)
        if not new:
            return
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._completer.add(new)
            self._cond.notify()

    def due(self, *, flush: bool = False) -> bool:
        """Never true here: the thread commits by itself. ``flush`` asks it to commit what waits now."""
        self.deliver()
        if flush:
            with self._cond:
                if self._completer.pending and not self._flush:
                    self._flush = True
                    self._cond.notify()
        return False

    def commit(self, bound: Any) -> None:
        """Nothing to do on the caller's thread (``due`` is never true)."""

    def wait_hint(self) -> float:
        """How soon the caller should look again: soon while outcomes wait, so they are reported."""
        return 0.05 if self.pending else 3600.0

    def wait(self, seconds: float, sleep: Callable[[float], None] | None = None) -> None:
        """Wait up to ``seconds`` for a commit to end (the caller's ``sleep`` is not needed here)."""
        with self._cond:
            if self._completer.pending or self._committing:
                self._cond.wait(seconds)
        self.deliver()

    def deliver(self) -> None:
        """Report, on this thread, what the commits since the last call did; raise what broke the thread."""
        while self._reports:
            self._on_report(self._reports.popleft())
        error, self._error = self._error, None
        if error is not None:
            raise error

    def drop_expired(self, bound: Any) -> None:
        with self._cond:
            self._completer.drop_expired(bound)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread once the commit under way ends; what still waits is the caller's to drain."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(CLOSE_TIMEOUT_SECONDS)

    # -- the commit thread ------------------------------------------------------------------------

    def _run(self) -> None:
        completer, me = self._completer, threading.current_thread()
        try:
            while True:
                with self._cond:
                    idle_since = time.monotonic()
                    while not completer.due(flush=self._flush):
                        if self._thread is not me:
                            return  # closed
                        if completer.pending:
                            idle_since = time.monotonic()
                        elif time.monotonic() - idle_since >= IDLE_EXIT_SECONDS:
                            self._thread = None
                            return
                        self._cond.wait(min(completer.wait_hint(), IDLE_WAKE_SECONDS))
                    if self._thread is not me:
                        return
                    batch = completer.take()
                    self._committing = len(batch)
                    bound = completer.bound
                try:
                    if completer.unavailable:
                        drop_broken_connection()
                    result = completer.run(batch)
                except BaseException as exc:  # handed to the worker's thread, as an inline commit would raise
                    result = None
                    self._error = exc
                with self._cond:
                    self._committing = 0
                    if isinstance(result, FinalizeReport | CommitUnavailable):
                        completer.settle(result, bound)
                    if not completer.pending:
                        self._flush = False
                    self._cond.notify_all()
        finally:
            connection.close()  # this thread's own connection
