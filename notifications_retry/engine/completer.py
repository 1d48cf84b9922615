"""The completer: commits outcomes in batches bounded by size and by time, and keeps them through outages.

An outcome waits at most ``max_delay`` seconds (default :data:`MAX_DELAY_SECONDS`) before its commit
starts, or less when ``max_batch`` outcomes are waiting: a crash between a send and its commit makes
the send happen twice, so the window is kept short. When the database cannot be reached, nothing is
dropped: the outcomes stay here and are committed, with backoff, once it is back. The claim token
makes a late commit safe (a row another worker took over refuses it as stale); a worker about to
exit drops, and logs, the outcomes whose lease ran out (:meth:`Completer.drop_expired`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import structlog

from notifications_retry.clock import Clock
from notifications_retry.delivery import CommitUnavailable, FinalizeReport, finalize
from notifications_retry.observability import metrics
from notifications_retry.outcomes import Outcome

log = structlog.get_logger("notifications_retry.worker")

#: The longest an outcome waits for batch-mates before its commit starts.
MAX_DELAY_SECONDS = 0.025
#: Backoff between commit attempts while the database is unreachable.
RETRY_FIRST_SECONDS = 0.1
RETRY_MAX_SECONDS = 2.0

Committer = Callable[[list[Outcome], datetime], FinalizeReport]


class Completer:
    """Outcomes waiting to be committed, and the rule for when to commit them.

    It runs on the worker's own thread (Django's connections are per thread): the scheduling loop
    asks :meth:`due` and :meth:`wait_hint` between its other steps, so sends in flight never wait for
    a commit, and a commit never waits longer than ``max_delay`` for more outcomes.
    """

    def __init__(
        self,
        *,
        clock: Clock,
        monotonic: Callable[[], float],
        on_report: Callable[[FinalizeReport], None],
        max_batch: int,
        max_delay: float = MAX_DELAY_SECONDS,
        commit: Committer = finalize,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic
        self.on_report = on_report
        self.max_batch = max(1, max_batch)
        self.max_delay = max_delay
        self._commit = commit
        self._pending: list[Outcome] = []
        self._first_at = 0.0
        self._retry_at = 0.0
        self._backoff = 0.0
        #: Commit attempts that found the database unreachable (for tests and the tick's stats).
        self.outages = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def unavailable(self) -> bool:
        """Whether the last commit found the database unreachable."""
        return self._backoff > 0

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
        )

    def wait_hint(self) -> float:
        """Seconds until :meth:`due` may turn true by the clock alone (a large number when nothing waits)."""
        if not self._pending:
            return 3600.0
        now = self.monotonic()
        return max(0.0, max(self._first_at + self.max_delay, self._retry_at) - now)

    def commit(self, bound: Any) -> None:
        """Commit up to ``max_batch`` waiting outcomes; keep them when the database is unreachable."""
        batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
        now = self.clock.now()
        try:
            report = self._commit(batch, now)
        except CommitUnavailable as exc:
            self.on_report(exc.report)
            self._pending = [*self._keep_leased(exc.pending, now, bound), *self._pending]
            self.outages += 1
            metrics.OUTCOME_COMMIT_DEFERRED.inc()
            self._backoff = min(RETRY_MAX_SECONDS, max(RETRY_FIRST_SECONDS, self._backoff * 2))
            self._retry_at = self.monotonic() + self._backoff
            bound.error(
                "outcomes-commit-deferred",
                reason=str(exc),
                waiting=len(self._pending),
                retry_in_s=round(self._backoff, 3),
            )
            return
        if self._backoff:
            bound.info("outcomes-commit-resumed", after_failures=self.outages)
        self._backoff = self._retry_at = 0.0
        if self._pending:
            self._first_at = self.monotonic()
        self.on_report(report)

    def _keep_leased(self, outcomes: list[Outcome], now: datetime, bound: Any) -> list[Outcome]:
        """Outcomes whose lease still holds; the rest are dropped and logged."""
        kept: list[Outcome] = []
        for outcome in outcomes:
            expires = outcome.record.lease_expires_at
            if expires is not None and expires <= now:
                bound.warning(
                    "item-stale",
                    notification_id=str(outcome.record.id),
                    reason="lease ran out while the database was unreachable; outcome discarded",
                )
            else:
                kept.append(outcome)
        return kept

    def drop_expired(self, bound: Any) -> None:
        """Forget outcomes whose lease ran out (called while waiting for the database)."""
        self._pending = self._keep_leased(self._pending, self.clock.now(), bound)
