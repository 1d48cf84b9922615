"""What one tick's scheduling asks of the database: claim due rows, give back rows never sent.

The dispatcher's rules (what to claim for each channel, when a send may start, when claiming stops)
call the database only through a :class:`TickDatabase`, so unit tests run a whole tick on a fake one
and a fake clock, with no thread and no sleep (tests/unit/test_scheduling_rules.py). Commits go
through the completer's ``commit`` (:data:`~.completer.Committer`), the wake-up between ticks through
:class:`~.wakeup.WakeupPort`. :data:`POSTGRES` is the real one: ``delivery``'s statements.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from notifications_retry.delivery import ClaimBatch, ClaimRequest, claim_due, release
from notifications_retry.delivery.claim import Settle
from notifications_retry.rules.outcomes import ClaimedRecord


class TickDatabase(Protocol):
    """The tick's two statements beside the commit."""

    def claim(self, request: ClaimRequest, *, settle: Settle | None, log: FilteringBoundLogger) -> ClaimBatch:
        """Lease due rows by ``request`` (:func:`~notifications_retry.delivery.claim_due`)."""

    def release(self, records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
        """Give back leased records never sent (:func:`~notifications_retry.delivery.release`)."""


class PostgresTickDatabase:
    """The :class:`TickDatabase` of a running worker: ``delivery``'s claim and release."""

    def claim(self, request: ClaimRequest, *, settle: Settle | None, log: FilteringBoundLogger) -> ClaimBatch:
        return claim_due(request, settle=settle, log=log)

    def release(self, records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
        return release(records, not_before=not_before)


#: The database a worker's ticks use.
POSTGRES = PostgresTickDatabase()
