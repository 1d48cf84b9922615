"""The completer: commits outcomes in batches bounded by size and by time, and keeps them through outages;
its commits as a task of the send loop (:class:`LoopCompleter`, below).

An outcome waits at most ``max_delay`` seconds (default :data:`MAX_DELAY_SECONDS`) before its commit
starts, or less when ``max_batch`` outcomes are waiting: a crash between a send and its commit makes
the send happen twice, so the window is kept short. When the database cannot be reached, nothing is
dropped: the outcomes stay here and are committed, with backoff, once it is back. The claim token
makes a late commit safe (a row another worker took over refuses it as stale); a worker about to
exit drops, and logs, the outcomes whose lease ran out (:meth:`Completer.drop_expired`).

With a worker's own cap on calls in flight (engine.flow_control's ``InFlightCap``), an outcome keeps
its call's slot until it leaves the completer, and a send waiting for such a slot makes the commit
start at once.

A running worker applies the same rule on its send loop, on a connection of its own
(:class:`LoopCompleter`), beside its claims. The worker's thread uses either through the same calls
(``add``, ``due``, ``commit``, ``wait_hint``, ``wait``, ``deliver``), so the dispatcher does not know
which one it has.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any, Protocol

import psycopg
import structlog
from structlog.typing import FilteringBoundLogger

from notifications_retry.delivery import (
    CommitUnavailable,
    FinalizeReport,
    NeedsDjango,
    finalize,
    finalize_async,
)
from notifications_retry.delivery.session import LoopConnection, NotConnected
from notifications_retry.exceptions import first_line
from notifications_retry.observability import metrics
from notifications_retry.rules.backoff import exponential_delay
from notifications_retry.rules.outcomes import Outcome
from notifications_retry.runtime.asyncio_bridge import SteppedLoop
from notifications_retry.runtime.clock import Clock

log = structlog.get_logger("notifications_retry.worker")

#: The longest an outcome waits for batch-mates before its commit starts.
MAX_DELAY_SECONDS = 0.010
#: Backoff between commit attempts while the database is unreachable.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0

Committer = Callable[[list[Outcome], datetime], FinalizeReport]


class HeldSlots(Protocol):
    """The worker's cap on calls in flight (engine.flow_control.InFlightCap), as the completer sees it."""

    @property
    def waiting_for_commit(self) -> bool: ...
    def release(self, outcomes: Iterable[Outcome]) -> None: ...


class Commits(Protocol):
    """What the worker and the dispatcher ask of a completer, inline or on its own thread."""

    bound: FilteringBoundLogger

    @property
    def pending(self) -> int: ...
    @property
    def unavailable(self) -> bool: ...
    def add(self, outcomes: Iterable[Outcome]) -> None: ...
    def due(self, *, flush: bool = False) -> bool: ...
    def commit(self, bound: FilteringBoundLogger) -> None: ...
    def wait_hint(self) -> float: ...
    def wait(self, seconds: float, sleep: Callable[[float], None]) -> None: ...
    def deliver(self) -> None: ...
    def drop_expired(self, bound: FilteringBoundLogger) -> None: ...
    def close(self) -> None: ...


class Completer:
    """Outcomes waiting to be committed, and the rule for when to commit them.

    Inline, it runs on the worker's own thread: the scheduling loop asks :meth:`due` and
    :meth:`wait_hint` between its other steps, so sends in flight never wait for a commit, and a
    commit never waits longer than ``max_delay`` for more outcomes. The worker runs the same rule on
    its send loop and a connection of its own (:class:`LoopCompleter`) unless it runs inside a
    transaction (a test's), where only its own connection sees the rows.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        monotonic: Callable[[], float],
        on_report: Callable[[FinalizeReport], None],
        max_batch: int,
        max_delay: float = MAX_DELAY_SECONDS,
        commit: Committer | None = None,
        slots: HeldSlots | None = None,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self.on_report = on_report
        self.max_batch = max(1, max_batch)
        self.max_delay = max_delay
        self._commit = commit if commit is not None else self._finalize
        #: Slots of the worker's cap held by outcomes waiting here (None: no cap to free).
        self.slots = slots
        self._pending: list[Outcome] = []
        self._first_at = 0.0
        self._retry_at = 0.0
        #: Commits in a row that found the database unreachable (0: the last one did not).
        self._failed_in_a_row = 0
        #: Commit attempts that found the database unreachable (for tests and the tick's stats).
        self.outages = 0
        #: The logger of the tick under way (the loop's commits log with it; inline, ``commit`` is given it).
        self.bound: FilteringBoundLogger = log

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def unavailable(self) -> bool:
        """Whether the last commit found the database unreachable."""
        return self._failed_in_a_row > 0

    def add(self, outcomes: Iterable[Outcome]) -> None:
        new = list(outcomes)
        if new and not self._pending:
            self._first_at = self.monotonic()
        self._pending.extend(new)

    def due(self, *, flush: bool = False) -> bool:
        """Whether a commit should start now (``flush``: whatever is waiting, ignoring the delay)."""
        if not self._pending or self.monotonic() < self._retry_at:
            return False
        return (
            flush
            or len(self._pending) >= self.max_batch
            or self.monotonic() - self._first_at >= self.max_delay
            or self._send_waits
        )

    def wait_hint(self) -> float:
        """Seconds until :meth:`due` may turn true by the clock alone (a large number when nothing waits)."""
        if not self._pending:
            return 3600.0
        now = self.monotonic()
        if self._send_waits:
            return max(0.0, self._retry_at - now)
        return max(0.0, max(self._first_at + self.max_delay, self._retry_at) - now)

    @property
    def _send_waits(self) -> bool:
        """Whether a send waits for a slot only a commit frees: then the batch delay is not waited out."""
        return self.slots is not None and self.slots.waiting_for_commit

    def commit(self, bound: FilteringBoundLogger) -> None:
        """Commit up to ``max_batch`` waiting outcomes; keep them when the database is unreachable."""
        batch = self.take()
        self.settle(self.run(batch), bound)

    def take(self) -> list[Outcome]:
        """The next batch to commit, no longer waiting here (see :meth:`run` and :meth:`settle`)."""
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        return batch

    def run(self, batch: list[Outcome]) -> FinalizeReport | CommitUnavailable:
        """Commit ``batch``: what was applied, or why the database could not be reached.

        Touches no state of its own.
        """
        try:
            return self._commit(batch, self.clock.now())
        except CommitUnavailable as exc:
            return exc

    def _finalize(self, batch: list[Outcome], now: datetime) -> FinalizeReport:
        # The tick's logger: a finalize that falls back says so with the tick's job_run_id and lane.
        return finalize(batch, now, log=self.bound)

    def settle(self, result: FinalizeReport | CommitUnavailable, bound: FilteringBoundLogger) -> None:
        """Report a commit's result; outcomes it could not write wait again, first in line, with backoff."""
        if isinstance(result, CommitUnavailable):
            self._release(result.report)
            self.on_report(result.report)
            self._pending = [*self.keep_leased(result.pending, self.clock.now(), bound), *self._pending]
            self.outages += 1
            metrics.OUTCOME_COMMIT_DEFERRED.inc()
            self._failed_in_a_row += 1
            backoff = exponential_delay(self._failed_in_a_row, RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS)
            self._retry_at = self.monotonic() + backoff
            bound.error(
                "outcomes-commit-deferred",
                reason=str(result),
                waiting=len(self._pending),
                retry_in_s=round(backoff, 3),
            )
            return
        if self._failed_in_a_row:
            bound.info("outcomes-commit-resumed", after_failures=self.outages)
        self._failed_in_a_row = 0
        self._retry_at = 0.0
        if self._pending:
            self._first_at = self.monotonic()
        self._release(result)
        self.on_report(result)

    def _release(self, report: FinalizeReport) -> None:
        if self.slots is not None:
            self.slots.release([*report.applied, *report.stale, *report.failed])

    def keep_leased(
        self, outcomes: list[Outcome], now: datetime, bound: FilteringBoundLogger
    ) -> list[Outcome]:
        """Outcomes whose lease still holds; the rest are dropped and logged."""
        kept: list[Outcome] = []
        dropped: list[Outcome] = []
        for outcome in outcomes:
            expires = outcome.record.lease_expires_at
            if expires is not None and expires <= now:
                dropped.append(outcome)
                bound.warning(
                    "item-stale",
                    notification_id=str(outcome.record.id),
                    outcome=outcome.result,
                    error_kind=outcome.error_kind or None,
                    reason="lease ran out before the outcome was committed; outcome discarded",
                )
            else:
                kept.append(outcome)
        if self.slots is not None and dropped:
            self.slots.release(dropped)
        return kept

    def put_back(self, batch: list[Outcome]) -> None:
        """A batch taken but not committed (its commit was cancelled): first in line again."""
        self._pending = [*batch, *self._pending]

    def drop_expired(self, bound: FilteringBoundLogger) -> None:
        """Forget outcomes whose lease ran out (called while waiting for the database)."""
        self._pending = self.keep_leased(self._pending, self.clock.now(), bound)

    # The inline completer commits on its caller's thread, so these have nothing to do beyond
    # waiting; they exist so that the worker treats it and the loop's completer alike.

    def wait(self, seconds: float, sleep: Callable[[float], None]) -> None:
        """Pause before looking again (a commit is due only by the clock here)."""
        sleep(seconds)

    def deliver(self) -> None:
        """Reports are made as each commit ends: nothing is held back."""

    def close(self) -> None:
        """No task to end, no connection of its own."""


def commit_in_hand(
    completer: Commits,
    bound: FilteringBoundLogger,
    *,
    give_up: Callable[[], bool],
    drop_expired: Callable[[], bool],
    sleep: Callable[[float], None],
) -> None:
    """Commit every outcome in hand; while the database is unreachable, retry with backoff, until
    ``give_up`` says so (a stop's grace ran out). While ``drop_expired`` says so (``--once``, a
    stopping worker), what its lease no longer covers is dropped, so that the process can exit."""
    while completer.pending:
        if give_up():
            bound.error("outcomes-abandoned", count=completer.pending, reason="stop requested")
            return
        if completer.due(flush=True):
            completer.commit(bound)
            continue
        if drop_expired():
            completer.drop_expired(bound)
        completer.wait(min(completer.wait_hint(), 0.25), sleep)
    completer.deliver()


# --------------------------------------------------------------------------------------------------
# Commits on the send loop: the completer's rule as a task of the worker's loop, on the loop's connection.
#
# A running worker commits its outcomes beside its claims. On the worker's thread, between claims, a commit
# (about 30 ms for a batch at high concurrency) made every claim behind it wait, so the calls in flight
# drained while nothing new was claimed. Here the commits are one task of the send loop
# (:class:`~notifications_retry.runtime.asyncio_bridge.SteppedLoop`), awaited on the loop's asynchronous
# psycopg connection (delivery.session), which the claims use too, in turns: they progress whenever
# the worker waits for its calls, as the sends do, and a commit waits at most for the claim under way. That
# connection is opened on the worker's thread, the loop run until it is open, never by the task in the
# background (a half-done connect would hold a restarting server up); a commit that finds it closed goes to
# Django's connection, and the next claim or commit opens it again. The same :class:`~.completer.Completer`
# rule (size or delay, backoff through outages) decides when; its state is changed on the worker's thread
# only, inside or between the loop's steps.
#
# A batch the loop's connection cannot commit goes to Django's connection instead, on the worker's thread
# (:meth:`LoopCompleter.due` is true and :meth:`LoopCompleter.commit` runs
# :func:`~notifications_retry.delivery.finalize`): a batch whose commit writes through Django's ORM (a
# channel's health change, a gone mailbox's suppression), or whose statements failed there. No commit runs
# on the loop until it is committed: the worker's thread does not run the loop while it commits, so a loop
# commit left mid-transaction would hold rows that commit waits for (the channel's health bucket).
# ``finalize`` tells a refused row (the others are committed one by one) from an outage (the outcomes wait,
# with backoff). Reports are made on the worker's thread outside the loop's steps
# (:meth:`LoopCompleter.deliver`): a signal's receiver may use Django's ORM, which refuses to run inside a
# running loop.
# --------------------------------------------------------------------------------------------------

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
        """Open the loop's connection here, on the loop's owner (delivery.session.LoopConnection: never in the
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
