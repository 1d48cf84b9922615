"""Claimed records given back unsent: their calls never started, so they keep their attempt.

A stop, a lost lock or a rebalance gives back what a tick has queued; a channel whose circuit opened
gives back its queued records; a channel its provider asked to wait (a 429, a 503 with Retry-After)
holds them back: their next attempt waits for the pause. Each goes through the tick's database port
(``release``) and says so in one ``records-released`` event.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.ports import TickDatabase
from notifications_retry.outcomes import ClaimedRecord


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

    def release(self, records: list[ClaimedRecord], reason: str, bound: Any = None) -> None:
        """Give ``records`` back as they were before their claim, saying why."""
        (bound or self.log()).info("records-released", count=self.db.release(records), reason=reason)

    def hold_back(self, rt: ChannelRuntime, records: list[ClaimedRecord], at: float | None = None) -> None:
        """Give back queued records of a channel its provider asked to wait: their next attempt waits for
        the pause (as seen at ``at``, the moment the channel was paused)."""
        wait = max(0.0, rt.paused_until - (rt.paused_at if at is None else at))
        not_before = self.now() + timedelta(seconds=wait)
        self.log().info(
            "records-released",
            count=self.db.release(records, not_before=not_before),
            reason="channel throttled before they were sent",
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


__all__ = ["GiveBack"]
