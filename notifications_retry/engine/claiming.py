"""Claims of one tick: what to claim, a second claim beside it when inline rows have a backlog, and
taking in what each claim returned.

A claim settles inline channels' records on the spot (their outcomes are written by the claim's own
transaction) and leases the others for the send loop. With a backlog of inline rows one claim at a
time leaves a core idle: the worker's Python and the server take turns. So once a claim of inline
channels alone came back full, every claim on the worker's thread has another running beside it on
the claim thread (engine.claim_thread), each on its own connection; ``SKIP LOCKED`` keeps their rows
apart. Settling runs under :attr:`Claims.settle_lock` (the channels' rate limiter, circuit and pause
are shared); everything a claim returned is taken in on the worker's thread, so the tick's stats and
the reporter need no lock.

A claim that comes back short beside another may only have met the other's locked rows, so it never
marks a channel exhausted: claims go back to one at a time, and a short claim alone does.

A claim of asynchronous channels alone runs on the :class:`ClaimConnection`, an asynchronous psycopg
connection the send loop awaits it on (engine.loop_connection): the calls in flight go on while the
server claims, on the worker's own thread. A claim that fails there is redone on Django's connection
(``claim-fallback``), whose fallbacks tell a poison row from an outage.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from typing import Any

import psycopg

from notifications_retry.conf import RetrySettings
from notifications_retry.delivery import ChannelClaim, ClaimBatch, Partitions, claim_due_async
from notifications_retry.delivery.channel_rules import RATE_HORIZON_SECONDS
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.claim_thread import ClaimThread
from notifications_retry.engine.completer import Commits
from notifications_retry.engine.loop_connection import LoopConnection
from notifications_retry.engine.ports import POSTGRES, TickDatabase
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.exception_chain import first_line
from notifications_retry.observability import metrics
from notifications_retry.outcomes import ClaimedRecord, Outcome

#: Delivers an inline channel's claimed record now (its outcome), or None to lease it; deferred
#: records' outcomes go to the list. Called with the settle lock held.
SettleOne = Callable[[ChannelRuntime, ClaimedRecord, list[Outcome]], Outcome | None]

#: The least a channel's next claim waits after tenants' limits cut one short.
MIN_CLAIM_WAIT_SECONDS = 0.01


class ClaimConnection(LoopConnection):
    """Claims awaited on the worker's send loop, on a connection of their own (engine.loop_connection)."""

    def claim(self, now: Any, plan: Sequence[ChannelClaim], **options: Any) -> ClaimBatch:
        """Run the claim on the send loop (the calls in flight go on meanwhile); raises psycopg's errors.

        ``options``: :func:`~notifications_retry.delivery.claim_due_async`'s own.
        """

        def work(conn: psycopg.AsyncConnection[Any]) -> Awaitable[ClaimBatch]:
            return claim_due_async(conn, now, plan, **options)

        return self.loop.run(self.run(work))


@dataclasses.dataclass
class AheadClaim:
    """A claim running on the claim thread, and what the worker's thread needs to take it in."""

    future: Future[tuple[ClaimBatch, list[Outcome]]]
    plan: list[ChannelClaim]
    total: int


class Claims:
    """Runs a tick's claims and takes in their rows; one per worker, reset by :meth:`begin_tick`."""

    def __init__(
        self,
        *,
        conf: RetrySettings,
        now: Callable[[], datetime],
        reporter: OutcomeReporter,
        completer: Commits,
        settle_one: SettleOne,
        lane_priorities: list[int] | None,
        claim_thread: ClaimThread | None = None,
        claim_connection: ClaimConnection | None = None,
        db: TickDatabase = POSTGRES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conf = conf
        self.monotonic = monotonic
        #: Where claims of asynchronous channels alone are awaited by the send loop (None: on ``db``).
        self.claim_connection = claim_connection
        self.db = db
        self.now = now
        self.reporter = reporter
        self.completer = completer
        self.settle_one = settle_one
        self.lane_priorities = lane_priorities
        self.claim_thread = claim_thread
        #: Held while inline channels' state is read or changed: two claims may settle at once.
        self.settle_lock = threading.Lock()
        #: Rows the claim could not read or lease, skipped from then on (logged once each).
        self.poisoned: set[Any] = set()
        self.ahead: AheadClaim | None = None
        #: Whether claims run two at a time now (inline channels with a backlog).
        self.paired = False
        #: The tick's channels and stats (set by :meth:`begin_tick`).
        self.runtimes: dict[int, ChannelRuntime] = {}
        self.stats: TickStats
        #: The partitions the tick owns (None: every row of the lane).
        self.partitions: Partitions | None = None

    def begin_tick(
        self, runtimes: dict[int, ChannelRuntime], stats: TickStats, partitions: Partitions | None = None
    ) -> None:
        self.ahead, self.paired = None, False
        self.runtimes, self.stats, self.partitions = runtimes, stats, partitions

    @property
    def running(self) -> bool:
        """A claim is running on the claim thread."""
        return self.ahead is not None

    @property
    def reserved(self) -> int:
        """Rows the claim on the claim thread may still return (counted against the tick's batch)."""
        return self.ahead.total if self.ahead is not None else 0

    def plan(self, wanted: Mapping[int, int], now_mono: float) -> list[ChannelClaim]:
        """What to claim of each channel: ``wanted`` rows for its lease, its tenants' caps with them
        (engine.tenant_limits); channels that want none are left out."""
        plan = []
        for cid, rt in self.runtimes.items():
            if wanted.get(cid, 0) > 0:
                caps = rt.tenants.caps(now_mono, RATE_HORIZON_SECONDS) if rt.tenants is not None else None
                if caps is not None:
                    metrics.TENANTS_HELD.labels(rt.key).set(sum(1 for cap in caps.caps.values() if cap == 0))
                plan.append(ChannelClaim(cid, wanted[cid], rt.lease_seconds(self.conf), caps))
        return plan

    def claim(self, plan: list[ChannelClaim], remaining: int, bound: Any) -> None:
        """Claim up to ``remaining`` rows by ``plan`` here, with one more claim beside it when paired."""
        if self.paired and self.ahead is None and self.claim_thread is not None:
            total = min(remaining, sum(p.limit for p in plan))
            skip = frozenset(self.poisoned)
            future = self.claim_thread.submit(lambda: self._claim_rows(plan, total, skip, bound))
            self.ahead = AheadClaim(future, plan, total)
            remaining -= total
            if remaining <= 0:
                return
        alone = self.ahead is None
        batch, pending = self._claim_rows(plan, remaining, self.poisoned, bound)
        self._take(batch, pending, plan, remaining, bound, alone=alone)

    def take_ahead(self, bound: Any, *, wait: bool) -> None:
        """Take in the claim thread's claim if it ended, or (``wait``, or no longer paired) once it ends."""
        ahead = self.ahead
        if ahead is None:
            return
        # Unpaired, nothing more is claimed beside it: its rows are waited for, never polled.
        if not (wait or not self.paired) and not ahead.future.done():
            return
        self.ahead = None
        batch, pending = ahead.future.result()
        self._take(batch, pending, ahead.plan, ahead.total, bound, alone=False)

    def finish(self, bound: Any) -> None:
        """End of a tick: take in a claim still running beside (its rows are committed), then close the
        claim thread's connection, so a tick leaves no second session open."""
        try:
            self.take_ahead(bound, wait=True)
        except Exception as exc:  # the tick may be ending on an error already: say this one, keep that one
            bound.error("claim-failed", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            if self.claim_thread is not None:
                self.claim_thread.close()

    def _claim_rows(
        self,
        plan: list[ChannelClaim],
        total: int,
        skip: Collection[Any],
        bound: Any,
    ) -> tuple[ClaimBatch, list[Outcome]]:
        """One claim, on whichever thread calls it: what it leased and settled, and the outcomes of the
        records its inline sends deferred (committed like any other)."""
        runtimes = self.runtimes
        budgets = {cid: (rt.config.max_attempts, rt.config.key) for cid, rt in runtimes.items()}
        pending: list[Outcome] = []
        common: dict[str, Any] = {
            "total": total,
            "budgets": budgets,
            "attempts_by_type": self.conf.ATTEMPTS_BY_TYPE,
            "priorities": self.lane_priorities,
            "skip": skip,
            "max_payload_bytes": self.conf.MAX_PAYLOAD_BYTES,
            "partitions": self.partitions,
        }
        if self.claim_connection is not None and not any(runtimes[p.channel_id].inline for p in plan):
            try:
                return self.claim_connection.claim(self.now(), plan, **common), pending
            except psycopg.Error as exc:
                # Redone on Django's connection, whose fallbacks tell a poison row from an outage.
                bound.warning("claim-fallback", fallback="django-connection", error=first_line(exc))

        def settle(record: ClaimedRecord) -> Outcome | None:
            # Providers without I/O deliver inside the claim: one row write instead of lease + finalize.
            rt = runtimes[record.channel_id]
            if not rt.inline:
                return None
            with self.settle_lock:
                return self.settle_one(rt, record, pending)

        return self.db.claim(self.now(), plan, settle=settle, log=bound, **common), pending

    def _take(
        self,
        batch: ClaimBatch,
        pending: list[Outcome],
        plan: list[ChannelClaim],
        remaining: int,
        bound: Any,
        *,
        alone: bool,
    ) -> None:
        """Queue, count and report what a claim returned (on the worker's thread)."""
        runtimes, stats = self.runtimes, self.stats
        got: dict[int, int] = {}
        now_mono = self.monotonic()
        with self.settle_lock:  # an inline channel's queue is read by the other claim's settling
            for record in batch.records:
                rt = runtimes[record.channel_id]
                rt.queue.append(record)
                if rt.tenants is not None:
                    rt.tenants.admit(record)  # it will take one of its tenant's slots
                got[record.channel_id] = got.get(record.channel_id, 0) + 1
        stats.claims += len(batch.records) + len(batch.settled)
        # Settled-in-claim rows were committed with the claim: account for them now.
        for outcome in batch.settled:
            got[outcome.record.channel_id] = got.get(outcome.record.channel_id, 0) + 1
        self.reporter.record_all(batch.settled)
        # Deferred or released records from inline sends that paused a channel (their rows were
        # claimed in this same claim: they wait for the completer like any other outcome).
        self.completer.add(o for o in pending if o.record.claim_token is not None)
        for nid, reason in batch.poisoned.items():
            self.poisoned.add(nid)
            stats.poisoned += 1
            metrics.POISONED.inc()
            bound.error("item-quarantined", notification_id=str(nid), reason=reason)
        full = all(got.get(p.channel_id, 0) >= p.limit for p in plan)
        if not alone:
            self.paired = self.paired and full
            return
        # A full claim of inline channels alone: a backlog, worth a second claimer from now on.
        inline = all(runtimes[p.channel_id].inline for p in plan)
        self.paired = self.claim_thread is not None and full and inline
        if not batch.more and not batch.poisoned and len(batch.records) + len(batch.settled) < remaining:
            for p in plan:
                if got.get(p.channel_id, 0) < p.limit:
                    self._short(runtimes[p.channel_id], p, batch, now_mono)

    def _short(self, rt: ChannelRuntime, p: ChannelClaim, batch: ClaimBatch, now_mono: float) -> None:
        """A channel's claim came back short: no more due rows this tick, unless tenants' limits cut it
        (engine.tenant_limits): then its next claim waits until one of them has room again."""
        limits, caps = rt.tenants, p.tenant_caps
        limiting = []
        if limits is not None and caps is not None:
            tenants = [r.tenant_id for r in batch.records if r.channel_id == p.channel_id]
            tenants += [o.record.tenant_id for o in batch.settled if o.record.channel_id == p.channel_id]
            limiting = limits.limiting(caps, tenants)
        if limits is None or not limiting:
            rt.exhausted = True
            return
        wait = limits.room_in(limiting, now_mono, RATE_HORIZON_SECONDS)
        # At least a few milliseconds (no claim in a loop); at most the horizon, so other tenants'
        # rows that fall due meanwhile are claimed soon.
        rt.claim_after = now_mono + min(max(wait, MIN_CLAIM_WAIT_SECONDS), RATE_HORIZON_SECONDS)
