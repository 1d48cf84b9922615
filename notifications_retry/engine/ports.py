"""What one tick's scheduling asks of the database: claim due rows, give back rows never sent.

The dispatcher's rules (what to claim for each channel, when a send may start, when claiming stops)
call the database only through a :class:`TickDatabase`, so unit tests run a whole tick on a fake one
and a fake clock, with no thread and no sleep (tests/unit/test_scheduling_rules.py). Commits go
through the completer's ``commit`` (:data:`~.completer.Committer`), the wake-up between ticks through
:class:`~.wakeup.WakeupPort`. :data:`POSTGRES` is the real one: ``delivery``'s statements.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from notifications_retry.delivery import ChannelClaim, ClaimBatch, Partitions, claim_due, release
from notifications_retry.outcomes import ClaimedRecord, Outcome


class TickDatabase(Protocol):
    """The tick's two statements beside the commit."""

    def claim(
        self,
        now: datetime,
        plan: Sequence[ChannelClaim],
        *,
        total: int,
        budgets: Mapping[int, tuple[int, str]],
        attempts_by_type: Mapping[str, int] | None,
        priorities: Sequence[int] | None,
        settle: Callable[[ClaimedRecord], Outcome | None] | None,
        skip: Collection[uuid.UUID],
        max_payload_bytes: int | None,
        log: Any,
        partitions: Partitions | None = None,
    ) -> ClaimBatch:
        """Lease up to ``total`` due rows by ``plan`` (:func:`~notifications_retry.delivery.claim_due`)."""

    def release(self, records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
        """Give back leased records never sent (:func:`~notifications_retry.delivery.release`)."""


class PostgresTickDatabase:
    """The :class:`TickDatabase` of a running worker: ``delivery``'s claim and release."""

    def claim(
        self,
        now: datetime,
        plan: Sequence[ChannelClaim],
        *,
        total: int,
        budgets: Mapping[int, tuple[int, str]],
        attempts_by_type: Mapping[str, int] | None,
        priorities: Sequence[int] | None,
        settle: Callable[[ClaimedRecord], Outcome | None] | None,
        skip: Collection[uuid.UUID],
        max_payload_bytes: int | None,
        log: Any,
        partitions: Partitions | None = None,
    ) -> ClaimBatch:
        return claim_due(
            now,
            plan,
            total=total,
            budgets=budgets,
            attempts_by_type=attempts_by_type,
            priorities=priorities,
            settle=settle,
            skip=skip,
            max_payload_bytes=max_payload_bytes,
            log=log,
            partitions=partitions,
        )

    def release(self, records: Sequence[ClaimedRecord], *, not_before: datetime | None = None) -> int:
        return release(records, not_before=not_before)


#: The database a worker's ticks use.
POSTGRES = PostgresTickDatabase()
