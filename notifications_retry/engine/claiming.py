"""Claims of one tick: what to claim, a second claim beside it when inline rows have a backlog, and
taking in what each claim returned.

A claim settles inline channels' records on the spot (their outcomes are written by the claim's own
transaction) and leases the others for the send loop. Claims run on the :class:`ClaimConnection`, the
asynchronous psycopg connection the send loop awaits them on, the commits' too, in turn
(delivery.session.LoopConnection): the calls in flight go on while the server claims. With a backlog of inline
rows one claim at a time leaves a core idle: the worker's Python and the server take turns. So once a
claim of inline channels alone came back full, every claim has another running beside it on a second
connection, a task of the same loop: while one waits for the server, the other's Python (reading its
rows, settling them) runs. Django's connection, idle meanwhile, is closed: still three connections.
``SKIP LOCKED`` keeps their rows apart. Everything runs on the worker's thread, so the channels' state
(rate limiter, circuit, pause), the tick's stats and the reporter need no lock; what a claim returned
is taken in by the dispatcher between the loop's steps.

A claim that comes back short beside another may only have met the other's locked rows, so it never
marks a channel exhausted: claims go back to one at a time, and a short claim alone does.

A claim that fails on its connection is redone on Django's connection (``claim-fallback``), whose
fallbacks tell a poison row from an outage; so is one whose settled outcome needs Django's ORM (a gone
mailbox's suppression), and every claim of a worker that has no connection of its own (inside a test's
transaction, whose rows no other connection can see).

A claim's inverse is here too (:class:`GiveBack`, below): claimed records given back unsent, with their
attempt, and those a database fault kept from going back, given back once it answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.db import DatabaseError, InterfaceError, connections
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import RetrySettings
from notifications_retry.delivery import (
    ChannelClaim,
    ClaimBatch,
    ClaimRequest,
    NeedsDjango,
    Partitions,
    claim_due_async,
)
from notifications_retry.delivery.claim import Settle
from notifications_retry.delivery.session import LoopConnection, NotConnected, drop_broken_connection
from notifications_retry.engine.channels import ChannelRuntime
from notifications_retry.engine.completer import Commits
from notifications_retry.engine.ports import POSTGRES, TickDatabase
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.exceptions import first_line
from notifications_retry.observability import metrics
from notifications_retry.rules.backoff import RATE_HORIZON_SECONDS
from notifications_retry.rules.outcomes import ClaimedRecord, Outcome

#: Delivers an inline channel's claimed record now (its outcome), or None to lease it; deferred
#: records' outcomes go to the list.
SettleOne = Callable[[ChannelRuntime, ClaimedRecord, list[Outcome]], Outcome | None]

#: The least a channel's next claim waits after tenants' limits cut one short.
MIN_CLAIM_WAIT_SECONDS = 0.01

#: What makes a claim on a loop connection be redone on Django's connection.
_REDONE = (psycopg.Error, NeedsDjango, NotConnected)


class ClaimConnection(LoopConnection):
    """Claims awaited on the worker's send loop, on its connection (delivery.session.LoopConnection)."""

    async def claim(self, request: ClaimRequest, *, connect: bool, settle: Settle | None) -> ClaimBatch:
        """The claim, awaited on the send loop (the calls in flight go on meanwhile); raises psycopg's
        errors, :class:`~notifications_retry.delivery.NeedsDjango`, and (``connect=False``, a claim in
        the background) :class:`NotConnected` when the connection is not open."""
        return await self.run(lambda conn: claim_due_async(conn, request, settle=settle), connect=connect)


@dataclasses.dataclass
class Attempt:
    """What a claim on a loop connection came back with: its rows, or (``batch`` None) why it must be
    redone on Django's connection, and whether it had delivered records before it failed."""

    batch: ClaimBatch | None
    pending: list[Outcome]
    delivered: int = 0
    error: BaseException | None = None


@dataclasses.dataclass
class RunningClaim:
    """A claim under way, a task of the send loop on a connection of its own, and what taking it in needs."""

    task: asyncio.Future[Attempt]
    connection: ClaimConnection
    plan: list[ChannelClaim]
    total: int
    skip: frozenset[Any]
    #: No other claim ran beside it: only such a claim, come back short, marks a channel exhausted.
    alone: bool


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
        claim_connection: ClaimConnection | None = None,
        beside_connection: ClaimConnection | None = None,
        db: TickDatabase = POSTGRES,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conf = conf
        self.monotonic = monotonic
        #: Where claims are awaited by the send loop (None: every claim on ``db``, Django's connection).
        self.claim_connection = claim_connection
        #: Where the claim beside runs, on a backlog of inline rows (None: one claim at a time).
        self.beside_connection = beside_connection
        self.db = db
        self.now = now
        self.reporter = reporter
        self.completer = completer
        self.settle_one = settle_one
        self.lane_priorities = lane_priorities
        #: Rows the claim could not read or lease, skipped from then on (logged once each).
        self.poisoned: set[Any] = set()
        #: Claims under way in the background (two at a time on a backlog of inline rows), oldest first.
        self.under_way: list[RunningClaim] = []
        #: Whether claims run two at a time now (inline channels with a backlog).
        self.paired = False
        #: The second connection could not be opened this tick: no claim runs beside until the next.
        self.beside_refused = False
        #: The tick's channels and stats (set by :meth:`begin_tick`).
        self.runtimes: dict[int, ChannelRuntime] = {}
        self.stats: TickStats
        #: The partitions the tick owns (None: every row of the lane).
        self.partitions: Partitions | None = None
        #: Each channel's (max_attempts, key), as the claims take them: the tick's channels do not change.
        self.budgets: dict[int, tuple[int, str]] = {}

    def begin_tick(
        self, runtimes: dict[int, ChannelRuntime], stats: TickStats, partitions: Partitions | None = None
    ) -> None:
        self.under_way, self.paired, self.beside_refused = [], False, False
        self.runtimes, self.stats, self.partitions = runtimes, stats, partitions
        self.budgets = {cid: (rt.config.max_attempts, rt.config.key) for cid, rt in runtimes.items()}

    @property
    def running(self) -> bool:
        """A claim is under way in the background (it is taken in before the tick ends)."""
        return bool(self.under_way)

    @property
    def reserved(self) -> int:
        """Rows the claims under way may still return (counted against the tick's batch)."""
        return sum(claim.total for claim in self.under_way)

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

    def claim(self, plan: list[ChannelClaim], remaining: int, bound: FilteringBoundLogger) -> None:
        """Claim up to ``remaining`` rows by ``plan``.

        Alone, one claim, run until it ends. Paired, a claim on each connection not claiming already
        (two in all), then the first to end is taken in while the other goes on: the server works on
        one while the worker's Python reads, settles and reports the other.
        """
        if self.paired and self.beside_connection is not None and self._start_pair(plan, remaining, bound):
            self._take_first(bound)
            return
        self.take_ahead(bound, wait=True)  # no longer paired: nothing runs beside a claim alone
        connection = self.claim_connection
        if connection is None:
            attempt = Attempt(None, [], error=NotConnected())
        else:
            attempt = connection.loop.run(
                self._attempt(connection, plan, remaining, self.poisoned, connect=True)
            )
        batch, pending = self._redo(attempt, plan, remaining, self.poisoned, bound)
        self._take(batch, pending, plan, remaining, bound, alone=True)

    def take_ahead(self, bound: FilteringBoundLogger, *, wait: bool) -> None:
        """Take in the claims under way that ended, or (``wait``, or no longer paired) all, once they end."""
        # Unpaired, nothing more is claimed beside them: their rows are waited for, never polled.
        if wait or not self.paired:
            while self.under_way:
                self._take_first(bound)
        else:
            self._take_ended(bound)

    def finish(self, bound: FilteringBoundLogger) -> None:
        """End of a tick: take in the claims still under way (their rows are committed), then close the
        second connection, so a tick leaves no second session open."""
        try:
            self.take_ahead(bound, wait=True)
        except Exception as exc:  # the tick may be ending on an error already: say this one, keep that one
            bound.error("claim-failed", error=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            # After a failure, a claim may still be under way: cancelled, its transaction is rolled back
            # (its rows come back as they were), and its connection is free for the next tick.
            left, self.under_way = self.under_way, []
            for claim in left:
                self._queue_leased(claim)
                claim.task.cancel()
            if left:
                tasks = [claim.task for claim in left]
                left[0].connection.loop.run(asyncio.gather(*tasks, return_exceptions=True))
            if self.beside_connection is not None:
                self.beside_connection.close()

    def _queue_leased(self, claim: RunningClaim) -> None:
        """A claim that ended but was never taken in (the tick failed first): the rows it leased go on
        their channels' queues, where the tick's end finds them unsent (they go back with their attempt)."""
        task = claim.task
        if not task.done() or task.cancelled() or task.exception() is not None:
            return
        batch = task.result().batch
        for record in batch.records if batch is not None else []:
            rt = self.runtimes.get(record.channel_id)
            if rt is not None:
                rt.queue.append(record)

    def _start_pair(self, plan: list[ChannelClaim], remaining: int, bound: FilteringBoundLogger) -> bool:
        """Start a claim on each open connection not claiming already; whether any claim is under way.

        Claims in the background never connect (delivery.session.LoopConnection): the second connection is
        opened here, by the loop's owner; one it cannot open leaves the claims one at a time.
        """
        claiming = {id(claim.connection) for claim in self.under_way}
        for connection in (self.claim_connection, self.beside_connection):
            total = min(remaining, sum(p.limit for p in plan))
            if connection is None or id(connection) in claiming or total <= 0:
                continue
            if connection is self.beside_connection and not self._connected(connection, bound):
                return bool(self.under_way)
            if not connection.open:
                continue  # the claims' own connection after a failure: the next claim alone reopens it
            skip = frozenset(self.poisoned)
            task = connection.loop.start(self._attempt(connection, plan, total, skip, connect=False))
            for claim in self.under_way:
                claim.alone = False
            self.under_way.append(RunningClaim(task, connection, plan, total, skip, alone=not self.under_way))
            remaining -= total
        return bool(self.under_way)

    def _take_first(self, bound: FilteringBoundLogger) -> None:
        """Run the send loop until a claim under way ends; take in those that ended."""
        if not any(claim.task.done() for claim in self.under_way):
            tasks = [claim.task for claim in self.under_way]
            self.under_way[0].connection.loop.run(asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED))
        self._take_ended(bound)

    def _take_ended(self, bound: FilteringBoundLogger) -> None:
        """Take in the claims under way that ended (a claim that must be redone, on Django's connection)."""
        for claim in [claim for claim in self.under_way if claim.task.done()]:
            self.under_way.remove(claim)
            batch, pending = self._redo(claim.task.result(), claim.plan, claim.total, claim.skip, bound)
            self._take(batch, pending, claim.plan, claim.total, bound, alone=claim.alone)

    def _connected(self, connection: ClaimConnection, bound: FilteringBoundLogger) -> bool:
        """Open ``connection`` from the loop's owner; a connect that fails leaves the claims one at a
        time until the next tick.

        Django's connection is handed back first: while claims run two at a time nothing uses it (the
        claims and their inline outcomes are the loop's), so the worker still holds three connections:
        its lock's, the claims' and this one. Its next use opens it again: the tick's bookkeeping, or a
        claim redone there after a failure.
        """
        if not connection.open:
            django_connection = connections[connection.alias]
            if not django_connection.in_atomic_block:
                django_connection.close()
        try:
            connection.connect()
        except psycopg.Error as exc:
            bound.warning("claim-beside-unavailable", error=first_line(exc))
            self.paired, self.beside_refused = False, True
            return False
        return True

    def _request(self, plan: list[ChannelClaim], total: int, skip: Collection[Any]) -> ClaimRequest:
        """The claim to run now, as both drivers take it."""
        return ClaimRequest(
            now=self.now(),
            plan=plan,
            total=total,
            budgets=self.budgets,
            attempts_by_type=self.conf.ATTEMPTS_BY_TYPE,
            priorities=self.lane_priorities,
            skip=skip,
            max_payload_bytes=self.conf.MAX_PAYLOAD_BYTES,
            partitions=self.partitions,
        )

    def _settler(self, attempt: Attempt) -> Callable[[ClaimedRecord], Outcome | None]:
        """Delivers an inline channel's record inside its claim (providers without I/O: one row write
        instead of lease + finalize), counted in ``attempt``; deferred records' outcomes go to its
        ``pending``."""
        runtimes, settle_one, pending = self.runtimes, self.settle_one, attempt.pending

        def settle(record: ClaimedRecord) -> Outcome | None:
            rt = runtimes[record.channel_id]
            outcome = settle_one(rt, record, pending) if rt.inline else None
            attempt.delivered += outcome is not None
            return outcome

        return settle

    async def _attempt(
        self,
        connection: ClaimConnection,
        plan: list[ChannelClaim],
        total: int,
        skip: Collection[Any],
        *,
        connect: bool,
    ) -> Attempt:
        """One claim on ``connection``, never raising what makes it be redone on Django's connection."""
        attempt = Attempt(None, [])
        inline = any(self.runtimes[p.channel_id].inline for p in plan)
        request = self._request(plan, total, skip)
        try:
            attempt.batch = await connection.claim(
                request, connect=connect, settle=self._settler(attempt) if inline else None
            )
        except _REDONE as exc:
            attempt.error = exc
            attempt.pending.clear()  # the claim rolled back: its rows come again
        return attempt

    def _redo(
        self,
        attempt: Attempt,
        plan: list[ChannelClaim],
        total: int,
        skip: Collection[Any],
        bound: FilteringBoundLogger,
    ) -> tuple[ClaimBatch, list[Outcome]]:
        """``attempt``'s rows, or the claim redone on Django's connection, whose fallbacks tell a poison
        row from an outage (without settling, if the attempt had delivered records: they are leased
        and sent again, as a claim whose outcomes cannot be written does)."""
        if attempt.batch is not None:
            return attempt.batch, attempt.pending
        error = attempt.error
        if error is not None and not isinstance(error, NeedsDjango | NotConnected):
            bound.warning("claim-fallback", fallback="django-connection", error=first_line(error))
        redone = Attempt(None, [])
        settle = self._settler(redone) if not attempt.delivered else None
        return self.db.claim(self._request(plan, total, skip), settle=settle, log=bound), redone.pending

    def _take(
        self,
        batch: ClaimBatch,
        pending: list[Outcome],
        plan: list[ChannelClaim],
        remaining: int,
        bound: FilteringBoundLogger,
        *,
        alone: bool,
    ) -> None:
        """Queue, count and report what a claim returned (on the worker's thread)."""
        runtimes, stats = self.runtimes, self.stats
        got: dict[int, int] = {}
        now_mono, now = self.monotonic(), self.now()
        reserves = {p.channel_id: runtimes[p.channel_id].start_reserve(self.conf) for p in plan}
        for record in batch.records:
            rt = runtimes[record.channel_id]
            if record.lease_expires_at is not None:  # the latest its call may start (engine.channels)
                left = (record.lease_expires_at - now).total_seconds()
                record.start_by = now_mono + left - reserves[record.channel_id]
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
        self.paired = self.beside_connection is not None and not self.beside_refused and full and inline
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


# --------------------------------------------------------------------------------------------------
# Claimed records given back unsent: their calls never started, so they keep their attempt.
#
# A stop, a lost lock or a rebalance gives back what a tick has queued; a channel whose circuit opened
# gives back its queued records; a channel its provider asked to wait (a 429, a 503 with Retry-After)
# holds them back: their next attempt waits for the pause. Each goes through the tick's database port
# (``release``) and says so in one ``records-released`` event.
#
# A database fault must not spend those attempts either. Records whose give-back the database refused,
# and records still queued when a database error ended their tick, are kept here (:meth:`GiveBack.keep`)
# and given back once it answers again (:meth:`GiveBack.release_kept`, before the worker's next claim):
# left to their lease, they would come back with an attempt spent and no call made.
# --------------------------------------------------------------------------------------------------

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
