"""Commits on the send loop: the completer's rule as a task of the worker's loop, on the loop's connection.

A running worker commits its outcomes beside its claims. On the worker's thread, between claims, a
commit (about 30 ms for a batch at high concurrency) made every claim behind it wait, so the calls in
flight drained while nothing new was claimed. Here the commits are one task of the send loop
(:class:`~notifications_retry.runtime.asyncio_bridge.SteppedLoop`), awaited on the loop's asynchronous psycopg
connection (engine.loop_connection), which the claims use too, in turns: they progress whenever the
worker waits for its calls, as the sends do, and a commit waits at most for the claim under way. That
connection is opened on the worker's thread, the loop run until it is open, never by the task in the
background (a half-done connect would hold a restarting server up); a commit that finds it closed goes
to Django's connection, and the next claim or commit opens it again. The same
:class:`~.completer.Completer` rule (size or delay, backoff through outages) decides when; its state is
changed on the worker's thread only, inside or between the loop's steps.

A batch the loop's connection cannot commit goes to Django's connection instead, on the worker's
thread (:meth:`LoopCompleter.due` is true and :meth:`LoopCompleter.commit` runs
:func:`~notifications_retry.delivery.finalize`): a batch whose commit writes through Django's ORM (a
channel's health change, a gone mailbox's suppression), or whose statements failed there. No commit
runs on the loop until it is committed: the worker's thread does not run the loop while it commits, so a
loop commit left mid-transaction would hold rows that commit waits for (the channel's health bucket).
``finalize`` tells a refused row (the others are committed one by one) from an outage (the outcomes
wait, with backoff). Reports are made on the worker's thread outside the loop's steps
(:meth:`LoopCompleter.deliver`): a signal's receiver may use Django's ORM, which refuses to run inside
a running loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any

import psycopg
from structlog.typing import FilteringBoundLogger

from notifications_retry.delivery import CommitUnavailable, FinalizeReport, NeedsDjango, finalize_async
from notifications_retry.engine.completer import Completer
from notifications_retry.engine.loop_connection import LoopConnection, NotConnected
from notifications_retry.exceptions import first_line
from notifications_retry.rules.outcomes import Outcome
from notifications_retry.runtime.asyncio_bridge import SteppedLoop

#: Commits a batch on the loop: its report, or raises (NeedsDjango, psycopg's errors: Django's
#: connection commits it instead; CommitUnavailable: the database cannot be reached).
AsyncCommitter = Callable[[list[Outcome], datetime], Awaitable[FinalizeReport]]

#: How long :meth:`LoopCompleter.close` runs the loop for a commit under way.
CLOSE_TIMEOUT_SECONDS = 10.0
#: After a failed connect, Django's connection commits alone this long before the next connect.
RECONNECT_SECONDS = 1.0


class LoopCompleter:
    """A :class:`Completer` whose commits are a task of ``loop``; what it cannot commit goes to Django's."""

    def __init__(
        self,
        completer: Completer,
        loop: SteppedLoop,
        *,
        connection: LoopConnection | None = None,
        commit: AsyncCommitter | None = None,
    ) -> None:
        self._completer = completer
        self._on_report = completer.on_report
        self._reports: collections.deque[FinalizeReport] = collections.deque()
        completer.on_report = self._reports.append  # reported by deliver(), outside the loop's steps
        self._loop = loop
        #: The commits' connection (the claims' too, in the worker); none when ``commit`` (a test's) brings
        #: its own way to the database.
        self._connection: LoopConnection | None = None
        if commit is None:
            self._connection = connection if connection is not None else LoopConnection(loop, role="commits")
        self._commit_async = commit if commit is not None else self._finalize_async
        #: Batches for Django's connection, committed on the worker's thread by commit().
        self._for_django: collections.deque[list[Outcome]] = collections.deque()
        self._committing = 0  # outcomes of the batch being committed on the loop right now
        self._flush = False
        self._task_running = False
        self._closing = False
        self._wake: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._connect_after = 0.0  # monotonic; a failed connect waits RECONNECT_SECONDS

    # -- what the worker's thread calls ---------------------------------------------------------

    @property
    def pending(self) -> int:
        """Outcomes not committed yet, counting the batch being committed."""
        waiting_for_django = sum(len(batch) for batch in self._for_django)
        return self._completer.pending + self._committing + waiting_for_django

    @property
    def unavailable(self) -> bool:
        return self._completer.unavailable

    @property
    def bound(self) -> Any:
        """The logger of the tick under way (the completer's)."""
        return self._completer.bound

    @bound.setter
    def bound(self, value: Any) -> None:
        self._completer.bound = value

    def add(self, outcomes: Iterable[Outcome]) -> None:
        new = list(outcomes)
        if new:
            self._completer.add(new)
            self._nudge()

    def due(self, *, flush: bool = False) -> bool:
        """Whether a batch waits for Django's connection (:meth:`commit`). ``flush`` asks the loop's
        task to commit what waits now; a step of the loop lets a commit under way go on."""
        self.deliver()
        if flush and self._completer.pending:
            self._flush = True
        self._nudge()
        if self._task_running:
            # The dispatcher may pass without waiting (nothing in flight, a claim on Django's
            # connection): one step keeps the commit going meanwhile.
            self._loop.pause(0)
            self.deliver()
        return bool(self._for_django)

    def commit(self, bound: FilteringBoundLogger) -> None:
        """Commit the next batch the loop left to Django's connection, on this thread."""
        if self._for_django:
            batch = self._for_django.popleft()
            self._completer.settle(self._completer.run(batch), bound)
            self.deliver()
        self._nudge()  # what waits behind it goes back to the loop

    def wait_hint(self) -> float:
        """How soon the caller should look again: now for Django's batches, soon while others wait."""
        if self._for_django:
            return 0.0
        return 0.05 if self.pending else 3600.0

    def wait(self, seconds: float, sleep: Callable[[float], None] | None = None) -> None:
        """Run the loop up to ``seconds``, until a commit ends; with nothing to commit, ``sleep``. A batch
        left to Django's connection is not waited for: the caller commits it now."""
        if not self.pending:
            if sleep is not None:
                sleep(seconds)
        elif not self._for_django:
            self._nudge()
            self._loop.wait(seconds)
        self.deliver()

    def deliver(self) -> None:
        """Report, on this thread, what the commits since the last call did; raise what broke the task."""
        while self._reports:
            self._on_report(self._reports.popleft())
        error, self._error = self._error, None
        if error is not None:
            raise error

    def drop_expired(self, bound: FilteringBoundLogger) -> None:
        self._completer.drop_expired(bound)
        now = self._completer.clock.now()
        kept = (self._completer.keep_leased(batch, now, bound) for batch in self._for_django)
        self._for_django = collections.deque(batch for batch in kept if batch)

    def close(self) -> None:
        """Let a commit under way end (what still waits is the caller's to drain); close the connection."""
        self._closing = True
        try:
            if self._task_running:
                self._nudge()
                self._loop.run(self._until_idle(CLOSE_TIMEOUT_SECONDS))
            if self._connection is not None:
                with contextlib.suppress(psycopg.Error):
                    self._connection.close()
        finally:
            self._closing = False

    # -- the loop's task ----------------------------------------------------------------------------

    def _nudge(self) -> None:
        """Start the commit task if outcomes wait and it is not running; wake it if it waits."""
        if self._wake is not None:
            self._wake.set()
        if not self._task_running and not self._closing and self._completer.pending and not self._for_django:
            self._connect()
            self._task_running = True
            self._loop.spawn([self._commits()])

    def _connect(self) -> None:
        """Open the loop's connection here, on the loop's owner (engine.loop_connection: never in the
        background); when it cannot be opened, the task leaves its batches to Django's connection."""
        monotonic, conn = self._completer.monotonic, self._connection
        if conn is None or conn.open or monotonic() < self._connect_after:
            return
        try:
            conn.connect()
        except psycopg.Error as exc:
            self._connect_after = monotonic() + RECONNECT_SECONDS
            bound = self._completer.bound
            bound.warning("commit-fallback", fallback="django-connection", error=first_line(exc))

    async def _commits(self) -> None:
        completer = self._completer
        self._wake = asyncio.Event()
        try:
            while not self._closing:
                if not completer.due(flush=self._flush):
                    if not completer.pending:
                        break
                    self._wake.clear()
                    # Woken by a new outcome or a flush, or when the delay (or an outage's backoff) ends.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), completer.wait_hint())
                    continue
                batch = completer.take()
                bound = completer.bound
                self._committing = len(batch)
                try:
                    result = await self._run(batch, bound)
                except asyncio.CancelledError:
                    completer.put_back(batch)  # the loop is closing: the caller drains what waits
                    raise
                finally:
                    self._committing = 0
                if result is None:
                    # Django's connection commits it on the worker's thread, which does not run this loop
                    # meanwhile. A commit of the next batch here, its transaction left open at a step
                    # (the health bucket's row locked), would hold up that commit, and neither would
                    # end: the task stops until the batch is committed (commit() starts it again).
                    self._for_django.append(batch)
                    self._loop.signal()
                    break
                completer.settle(result, bound)
                if not completer.pending:
                    self._flush = False
                self._loop.signal()  # the worker's wait ends: a report to deliver
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # raised on the worker's thread by deliver()
            self._error = exc
            self._loop.signal()
        finally:
            self._task_running = False
            self._wake = None

    async def _run(
        self, batch: list[Outcome], bound: FilteringBoundLogger
    ) -> FinalizeReport | CommitUnavailable | None:
        """Commit ``batch`` on the loop: its report, an outage, or None (Django's connection commits it)."""
        try:
            return await self._commit_async(batch, self._completer.clock.now())
        except CommitUnavailable as exc:
            return exc
        except (NeedsDjango, NotConnected):
            return None
        except psycopg.Error as exc:
            # Redone on Django's connection, whose fallbacks tell a refused row from an outage.
            bound.warning("commit-fallback", fallback="django-connection", error=first_line(exc))
            return None

    async def _finalize_async(self, batch: list[Outcome], now: datetime) -> FinalizeReport:
        assert self._connection is not None  # the default committer's own
        return await self._connection.run(lambda conn: finalize_async(conn, batch, now), connect=False)

    async def _until_idle(self, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while self._task_running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)


__all__ = ["CLOSE_TIMEOUT_SECONDS", "AsyncCommitter", "LoopCompleter"]
