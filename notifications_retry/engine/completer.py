"""The completer: commits outcomes in batches bounded by size and by time, and keeps them through outages.

An outcome waits at most ``max_delay`` seconds (default :data:`MAX_DELAY_SECONDS`) before its commit
starts, or less when ``max_batch`` outcomes are waiting: a crash between a send and its commit makes
the send happen twice, so the window is kept short. When the database cannot be reached, nothing is
dropped: the outcomes stay here and are committed, with backoff, once it is back. The claim token
makes a late commit safe (a row another worker took over refuses it as stale); a worker about to
exit drops, and logs, the outcomes whose lease ran out (:meth:`Completer.drop_expired`).

With a worker's own cap on calls in flight (engine.in_flight), an outcome keeps its call's slot
until it leaves the completer, and a send waiting for such a slot makes the commit start at once.

A running worker applies the same rule on its send loop, on a connection of its own
(engine.loop_completer), beside its claims. The worker's thread uses either through the same calls
(``add``, ``due``, ``commit``, ``wait_hint``, ``wait``, ``deliver``), so the dispatcher does not know
which one it has.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Protocol

import structlog
from structlog.typing import FilteringBoundLogger

from notifications_retry.delivery import CommitUnavailable, FinalizeReport, finalize
from notifications_retry.observability import metrics
from notifications_retry.rules.backoff import exponential_delay
from notifications_retry.rules.outcomes import Outcome
from notifications_retry.runtime.clock import Clock

log = structlog.get_logger("notifications_retry.worker")

#: The longest an outcome waits for batch-mates before its commit starts.
MAX_DELAY_SECONDS = 0.010
#: Backoff between commit attempts while the database is unreachable.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0

Committer = Callable[[list[Outcome], datetime], FinalizeReport]


class HeldSlots(Protocol):
    """The worker's cap on calls in flight (engine.in_flight.InFlightCap), as the completer sees it."""

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
    its send loop and a connection of its own (engine.loop_completer) unless it runs inside a
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
