"""Claimed records given back unsent: their calls never started, so they keep their attempt.

A stop, a lost lock or a rebalance gives back what a tick has queued; a channel whose circuit opened
gives back its queued records; a channel its provider asked to wait (a 429, a 503 with Retry-After)
holds them back: their next attempt waits for the pause. Each goes through the tick's database port
(``release``) and says so in one ``records-released`` event.

A database fault must not spend those attempts either. Records whose give-back the database refused,
and records still queued when a database error ended their tick, are kept here
(:meth:`GiveBack.keep`) and given back once it answers again (:meth:`GiveBack.release_kept`, before the
worker's next claim): left to their lease, they would come back with an attempt spent and no call made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import DatabaseError, InterfaceError
from structlog.typing import FilteringBoundLogger

from notifications_retry.delivery.session import drop_broken_connection
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.ports import TickDatabase
from notifications_retry.exceptions import first_line
from notifications_retry.rules.outcomes import ClaimedRecord

#: What a give-back raises when the database cannot take it (the records are kept for later).
DATABASE_ERRORS = (DatabaseError, InterfaceError, psycopg.Error)


@dataclasses.dataclass
class Kept:
    """Records to give back once the database answers: why, and the pause their next attempt waits for."""

    records: list[ClaimedRecord]
    reason: str
    not_before: datetime | None = None


class GiveBack:
    """Gives back a tick's unsent records (``now``: the tick's clock; ``log``: the tick's logger)."""

    def __init__(
        self,
        db: TickDatabase,
        *,
        now: Callable[[], datetime],
        monotonic: Callable[[], float],
        log: Callable[[], Any],
    ) -> None:
        self.db, self.now, self.monotonic, self.log = db, now, monotonic, log
        #: Records a database fault kept from going back, oldest first (:meth:`release_kept`).
        self.kept: list[Kept] = []

    def release(
        self, records: list[ClaimedRecord], reason: str, bound: FilteringBoundLogger | None = None
    ) -> None:
        """Give ``records`` back as they were before their claim, saying why."""
        (bound or self.log()).info("records-released", count=self._release(records, reason), reason=reason)

    def hold_back(self, rt: ChannelRuntime, records: list[ClaimedRecord], at: float | None = None) -> None:
        """Give back queued records of a channel its provider asked to wait: their next attempt waits for
        the pause (as seen at ``at``, the moment the channel was paused)."""
        wait = max(0.0, rt.paused_until - (rt.paused_at if at is None else at))
        not_before = self.now() + timedelta(seconds=wait)
        reason = "channel throttled before they were sent"
        self.log().info(
            "records-released",
            count=self._release(records, reason, not_before),
            reason=reason,
            channel=rt.key,
            not_before=not_before.isoformat(),
        )

    def unsendable(self, rt: ChannelRuntime, records: list[ClaimedRecord]) -> None:
        """Queued records of a channel that can neither call its provider nor its fallback now."""
        at = self.monotonic()
        if at < rt.paused_until:
            self.hold_back(rt, records, at)
        else:
            self.release(records, "circuit open and the fallback cannot take them")

    def _release(self, records: list[ClaimedRecord], reason: str, not_before: datetime | None = None) -> int:
        """The give-back itself; records the database refuses are kept (then the error is raised on)."""
        try:
            return self.db.release(records, not_before=not_before)
        except DATABASE_ERRORS:
            self.keep(records, reason, not_before)
            raise

    def keep(self, records: list[ClaimedRecord], reason: str, not_before: datetime | None = None) -> None:
        """Give ``records`` back later, with their attempt: none of their calls started, and the database
        may not answer now (their tick ended on its error)."""
        leased = [record for record in records if record.claim_token is not None]
        if leased:
            self.kept.append(Kept(leased, reason, not_before))

    def release_kept(self, bound: FilteringBoundLogger) -> None:
        """Give back what a database fault kept, oldest first; what the database still refuses stays kept.

        Under their claim token, as any give-back: a row whose lease ran out meanwhile is given back
        all the same (the lapsed-lease give-back keeps the token), one another worker took over is not
        touched. The worker calls this before its next claim, so its own claim never takes such a row
        back as a recovered one, with a second attempt counted.
        """
        if not self.kept:
            return
        drop_broken_connection()  # the error that kept them may have ended this thread's connection
        while self.kept:
            item = self.kept[0]
            try:
                count = self.db.release(item.records, not_before=item.not_before)
            except DATABASE_ERRORS as exc:
                waiting = sum(len(kept.records) for kept in self.kept)
                bound.warning("records-release-deferred", count=waiting, error=first_line(exc))
                return
            del self.kept[0]
            bound.info("records-released", count=count, reason=item.reason, after_database_error=True)


__all__ = ["DATABASE_ERRORS", "GiveBack", "Kept"]
