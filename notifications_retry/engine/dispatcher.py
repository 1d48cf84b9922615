"""The dispatcher: one tick's scheduling loop — claim what can start soon, start sends, hand outcomes on.

One thread owns the tick: the worker's. It claims (engine.claiming), runs inline providers, and hands
outcomes to the completer (its ``LoopCompleter`` commits them on a connection of its own). The other
providers' calls, the claims and the commits are tasks of the worker's send loop (``SteppedLoop``),
which this thread runs whenever it waits. A finished call feeds its channel's flow control and starts
the channel's next queued record itself, within that step; its outcome is handed over in
:attr:`Dispatcher.done`. A channel's state (capacity, rate limiter, circuit) is thus changed on one
thread only, with no lock. Records a channel can no longer send (its circuit opened, the provider
asked it to wait) are given back (after a throttle, due again when the pause ends) — unless the
channel has a fallback that can take them (engine.failover).

A channel found disabled during the tick stops at once: as soon as the worker has an outcome that
disables it by itself (a 410 Gone, delivery.health.disables_at_once), or a commit that found it disabled
(its failure ratio, another worker's change, an operator's), no further call starts on it, the calls in
flight finish, and its queued records are given back unsent with their attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import structlog
from structlog.typing import FilteringBoundLogger

from notifications_retry.conf import RetrySettings
from notifications_retry.database.locks import AdvisoryLock, Ownership, PartitionLock
from notifications_retry.delivery import Partitions
from notifications_retry.delivery.health import disables_at_once
from notifications_retry.engine.channels import ChannelRuntime, next_wait
from notifications_retry.engine.claiming import ClaimConnection, Claims, GiveBack
from notifications_retry.engine.completer import Commits
from notifications_retry.engine.executor import Executor, calls_bound_seconds
from notifications_retry.engine.failover import Failover, Rerouted, eligible
from notifications_retry.engine.flow_control import (
    FlowFeedback,
    InFlightCap,
    Returned,
    fit_to_room,
    sort_returns,
    take_queue,
    throttles,
)
from notifications_retry.engine.ports import POSTGRES, TickDatabase
from notifications_retry.engine.reporting import OutcomeReporter, TickStats
from notifications_retry.rules.outcomes import SENT, ClaimedRecord, Outcome
from notifications_retry.runtime.asyncio_bridge import SteppedLoop

log = structlog.get_logger("notifications_retry.worker")

#: After the first finished call, let the send loop run this long for more before collecting: a
#: pass of the dispatcher per finished call would leave the loop standing still between passes.
COLLECT_DELAY_SECONDS = 0.002
#: How often, at most, a claim is preceded by a check that the cycle's lock is still ours. Losing it
#: late costs nothing worse than a second owner's SKIP LOCKED claims and token-guarded finalizes.
LOCK_CHECK_SECONDS = 0.5
#: Rows one claim transaction takes at most (and one commit of outcomes writes), never more than the
#: tick's batch. It matters for inline channels (``in_app``, ``stub``), whose rows are settled inside
#: their claim, and for a burst of outcomes: each transaction has a fixed cost (statements planned, round
#: trips, a commit), so a backlog drains faster in bigger chunks, while 500 keeps one transaction's row
#: locks and statement short; a webhook or email channel claims by its ``max_concurrency`` instead, and a
#: claim also stops at about 16 MiB of payloads (delivery.claim), so memory does not follow it.
CLAIM_CHUNK_SIZE = 500


def chunk_size(batch_size: int) -> int:
    """Rows one claim (or one commit of outcomes) takes in a tick of ``batch_size``: the chunk, or less."""
    return max(1, min(CLAIM_CHUNK_SIZE, batch_size))


class Finished:
    """A call that ended: its outcome, and the queued records its channels could no longer send
    (the primary's and, after a failover, the fallback's)."""

    __slots__ = ("outcome", "returns")

    def __init__(self, outcome: Outcome, returns: list[Returned]) -> None:
        self.outcome, self.returns = outcome, returns


class Dispatcher:
    """Runs one tick's loop over the lane's channels; state that outlives a tick is passed in."""

    def __init__(
        self,
        *,
        conf: RetrySettings,
        executor: Executor,
        completer: Commits,
        reporter: OutcomeReporter,
        send_loop: Callable[[], SteppedLoop],
        monotonic: Callable[[], float],
        stopping: Callable[[], bool],
        lane_priorities: list[int] | None,
        claim_connection: ClaimConnection | None = None,
        beside_connection: ClaimConnection | None = None,
        db: TickDatabase = POSTGRES,
        sleep: Callable[[float], None] = time.sleep,
        cap: InFlightCap | None = None,
    ) -> None:
        self.conf = conf
        #: The worker's cap on calls in flight, shared by its channel runtimes (engine.flow_control).
        self.cap = cap if cap is not None else InFlightCap(None)
        #: Claims and releases go through this port (a fake one in unit tests); commits, the completer's.
        self.db = db
        self.sleep = sleep
        self.executor = executor
        self.completer = completer
        self.reporter = reporter
        self.send_loop = send_loop
        self.monotonic = monotonic
        self.stopping = stopping
        self.lane_priorities = lane_priorities
        #: The tick's channels (set by :meth:`run`): a commit that found one disabled stops it.
        self.runtimes: dict[int, ChannelRuntime] = {}
        if reporter is not None:  # some unit tests run a dispatcher without one
            reporter.on_disabled = self._found_disabled
        self.running = 0  # calls started and not yet handed back through ``done``
        #: When the last call started (monotonic): queued records still start after claiming stopped.
        self.last_start = 0.0
        #: Calls that ended since the last :meth:`collect`, appended by their tasks on this thread.
        self.done: list[Finished] = []
        #: Set when the tick stopped waiting for calls that outlived every bound.
        self.abandoned = False
        #: Whether the tick still owns the cycle: asked before every new provider call.
        self.ownership: Ownership | None = None
        self.feedback = FlowFeedback(monotonic, None)
        #: Claimed records given back unsent (a stop, a lost lock, a circuit opened, a throttle).
        self.give_back = GiveBack(
            db,
            now=lambda: self.executor.clock.now(),  # the executor's clock, as the tick sets it
            monotonic=monotonic,
            log=lambda: self.feedback.bound or log,
        )
        self.claims = Claims(
            conf=conf,
            now=lambda: self.executor.clock.now(),  # the executor's clock, as the tick sets it
            reporter=reporter,
            completer=completer,
            settle_one=self._settle_one,
            lane_priorities=lane_priorities,
            claim_connection=claim_connection,
            beside_connection=beside_connection,
            db=db,
            monotonic=monotonic,
        )
        #: Sends through fallback channels (engine.failover), built the first time a channel with a
        #: fallback needs it (:meth:`_failover`): a lane without fallbacks never builds it.
        self.failover: Failover | None = None

    # -- the loop ------------------------------------------------------------------------------

    def run(
        self,
        runtimes: dict[int, ChannelRuntime],
        stats: TickStats,
        *,
        batch_size: int,
        deadline: float,
        lock: AdvisoryLock,
        bound: FilteringBoundLogger,
    ) -> None:
        """Claim, send and commit until done, the batch is full, the deadline passed, or a stop was asked."""
        self.feedback.bound = bound
        self.runtimes = runtimes
        completer = self.completer
        claiming = True
        remaining = batch_size
        lock_checked_at = self.monotonic()
        ownership = self.ownership = Ownership(self.monotonic, lock.idle_session_timeout)
        ownership.begin(lock_checked_at)  # the tick took the lock just now
        chunk = chunk_size(batch_size)
        self.abandoned = False
        # No call may outlive its timeout and the executor's grace (the one grace after a timeout, so
        # the executor's own timeout outcome always comes first): past that (a provider that ignores
        # its own deadline) the tick stops waiting, and the records come back after their lease.
        calls_bound = calls_bound_seconds(runtimes.values())
        drain_from: float | None = None
        claims = self.claims
        partitioned = lock if isinstance(lock, PartitionLock) else None
        owned = Partitions(partitioned.partitions, partitioned.owned) if partitioned is not None else None
        claims.begin_tick(runtimes, stats, owned)
        while True:
            now_mono = self.monotonic()
            if claiming and (self.stopping() or now_mono >= deadline or remaining <= 0):
                claiming = False
                stats.stopped = self.stopping()
                stats.deadline_reached = now_mono >= deadline
            if not claiming and drain_from is None:
                drain_from = now_mono
            # Each call has its timeout and the grace from its own start, however late it started.
            if (
                drain_from is not None
                and self.running
                and now_mono - max(drain_from, self.last_start) > calls_bound
            ):
                self.abandoned = True
                bound.error("calls-abandoned", count=self.running, reason="past the channel timeout")
                break
            if (self.stopping() or ownership.lost) and any(rt.queue for rt in runtimes.values()):
                why = "stop requested" if self.stopping() else "the cycle's lock was lost"
                self._release_queued(runtimes, bound, f"{why} before they were sent")
            # The lock is asked about on every pass, claiming or not: sends start only while it was
            # seen held within the ownership window, and the question keeps its session from idling.
            if not ownership.lost and now_mono - lock_checked_at >= LOCK_CHECK_SECONDS:
                lock_checked_at = self.monotonic()
                ownership.confirm(lock.still_held(), lock_checked_at)
                if ownership.lost:
                    stats.lock_lost = True
                    bound.error("retry-cycle-lock-lost")
                    claiming = False
                    self._release_queued(runtimes, bound, "the cycle's lock was lost before they were sent")
                elif claiming and partitioned is not None and partitioned.rebalance_due:
                    # A worker joined or died: end the tick (what is queued goes back to its partition's
                    # rows), so the next one takes this worker's new fair share.
                    stats.rebalanced, claiming = True, False
                    bound.info("partitions-rebalance", owned=list(partitioned.owned), share=partitioned.share)
                    self._release_queued(runtimes, bound, "the worker's partitions are rebalanced")
            claims.take_ahead(bound, wait=not claiming)
            # What may start (a slot a commit just freed) starts before a claim, not after its round trip.
            self._start(runtimes)
            if claiming:
                wanted = {c: rt.capacity(now_mono, chunk) for c, rt in runtimes.items()}
                plan = claims.plan(fit_to_room(runtimes, wanted), now_mono)
                if not plan:
                    claims.take_ahead(bound, wait=True)  # nothing to claim beside it: wait, not spin
                elif ownership.may_send():
                    claims.claim(plan, remaining, bound)
                    remaining = batch_size - stats.claims - claims.reserved
            self._start(runtimes)
            # Wait for finished calls no longer than the completer may hold an outcome back.
            wait = min(next_wait(runtimes, self.monotonic()), completer.wait_hint()) if self.running else 0.0
            # Batch completions, unless a rate-limited channel waits to start its next send: a start
            # delayed past its slot is throughput lost for good (the bucket never bursts to catch up).
            pacing = any(rt.queue and rt.paced for rt in runtimes.values())
            self.collect(wait, 0.0 if pacing else COLLECT_DELAY_SECONDS, bound)
            queued = any(rt.queue or rt.lapsed for rt in runtimes.values())
            idle = not self.running and not self.done and not queued and not claims.running
            calls = bool(self.running)
            if completer.due(flush=idle or not claiming):
                completer.commit(bound)
            if idle:
                if not claiming:
                    break
                stuck = not any(rt.capacity(self.monotonic(), chunk) for rt in runtimes.values())
                # Every channel exhausted, paused or open-circuited for now, unless a tenant's limit
                # only delays a channel's next claim: then wait for it.
                if stuck and not any(rt.claim_after > self.monotonic() for rt in runtimes.values()):
                    break
                if stuck:
                    completer.wait(next_wait(runtimes, self.monotonic()), self.sleep)
            elif not calls and queued:
                if not claiming and completer.unavailable and self.cap.waiting_for_commit:
                    # The database refuses commits and every place under the cap waits for one: the
                    # queue cannot start before the outage ends. It goes back (a release the outage
                    # refuses ends the tick as a failed claim does; the records are kept, and given
                    # back with their attempt once the database answers: engine.claiming's GiveBack).
                    self._release_queued(runtimes, bound, "the worker's cap waits for commits")
                    continue
                # Through the completer: outcomes it holds go on committing meanwhile (on the send loop).
                completer.wait(min(next_wait(runtimes, self.monotonic()), completer.wait_hint()), self.sleep)

    def finish_calls(self, bound: FilteringBoundLogger, timeout: float) -> None:
        """Wait for the calls in flight (up to ``timeout`` seconds) and collect their outcomes.

        Records still queued start no call: the tick ended on a database error (or its calls outlived
        every bound). They are kept to be given back with their attempt (``GiveBack.release_kept``),
        those a call in flight puts back in line as it ends too."""
        self._keep_unsent()
        if self.abandoned:
            timeout = 0.0
        until = self.monotonic() + timeout
        while self.running and self.monotonic() < until:
            self.collect(min(0.05, max(0.0, until - self.monotonic())), 0.0, bound)
        self.collect(0.0, 0.0, bound)
        self._keep_unsent()

    def _keep_unsent(self) -> None:
        runtimes = self.claims.runtimes.values()
        unsent = [record for rt in runtimes for record in [*take_queue(rt), *rt.take_lapsed()]]
        self.give_back.keep(unsent, "the tick ended before they were sent")

    # -- claiming ------------------------------------------------------------------------------

    def _settle_one(self, rt: ChannelRuntime, record: ClaimedRecord, out: list[Outcome]) -> Outcome | None:
        """A claimed record of an inline channel, delivered now if it may start; None leases it for
        later (a paused channel's is given back by :meth:`_start`)."""
        now_mono = self.monotonic()
        if rt.queue or not rt.can_start(now_mono) or not self._may_send():
            return None
        if rt.tenants is not None and not rt.tenants.start(record, now_mono):
            return None  # its tenant's next slot is ahead: leased and queued until then
        return self._send_inline(rt, record, out)

    def _may_send(self, at: float | None = None) -> bool:
        """Whether a new provider call may start: no stop asked, the cycle still ours (database.locks)."""
        return not self.stopping() and self.ownership is not None and self.ownership.may_send(at)

    def _stop(self, rt: ChannelRuntime, why: str) -> None:
        """No further call starts on ``rt`` this tick (it was found disabled); what it has queued is
        given back by :meth:`_start`, on this thread and outside the send loop's steps."""
        if rt.stopped:
            return
        rt.stopped = why
        (self.feedback.bound or log).warning(
            "channel-calls-stopped", channel=rt.key, reason=why, in_flight=rt.inflight, queued=len(rt.queue)
        )
        self.send_loop().signal()  # the dispatcher's wait ends: the queue goes back now

    def _found_disabled(self, channel_ids: list[int]) -> None:
        """A commit found these channels disabled (the completer's report, on this thread)."""
        for cid in channel_ids:
            rt = self.runtimes.get(cid)
            if rt is not None:
                self._stop(rt, "the channel was disabled (its endpoint health or an operator)")

    def _outcome(self, rt: ChannelRuntime, outcome: Outcome, probe: bool) -> Outcome:
        """A call's outcome, a failed probe of its circuit marked with how long the circuit has been
        open (endpoint health judges it on fewer calls); a 410 Gone stops ``rt`` at once."""
        if probe and outcome.result != SENT and rt.breaker.open_since is not None:
            open_for = rt.breaker.open_for(self.monotonic())
            outcome = dataclasses.replace(outcome, circuit_open_for=open_for)
        if disables_at_once(outcome):
            self._stop(rt, "the endpoint answered 410 Gone")
        return outcome

    def _release_queued(
        self, runtimes: dict[int, ChannelRuntime], bound: FilteringBoundLogger, reason: str
    ) -> None:
        """Give back claimed records not started yet: only the calls in flight are finished."""
        queued = [record for rt in runtimes.values() for record in [*take_queue(rt), *rt.take_lapsed()]]
        self.give_back.release(queued, reason, bound)

    # -- sending -------------------------------------------------------------------------------

    def _start(self, runtimes: dict[int, ChannelRuntime]) -> None:
        """Start what may start now: inline providers run right here, others on the send loop."""
        lapsed = [record for rt in runtimes.values() if rt.lapsed for record in rt.take_lapsed()]
        if lapsed:
            self.give_back.release(lapsed, "queued until their lease could no longer cover a call")
        if not self._may_send():
            return  # after a stop, what is queued is given back; unconfirmed, it waits for the lock
        for rt in runtimes.values():
            if rt.stopped:
                if rt.queue:  # claimed before it was found disabled, or by a claim already running
                    self.give_back.release(take_queue(rt), f"channel {rt.key} stopped before they were sent")
                continue
            if rt.inline:
                outcomes: list[Outcome] = []
                held: list[ClaimedRecord] = []
                while (record := rt.next_startable(self.monotonic())) is not None:
                    self._send_inline(rt, record, outcomes)
                # Paused, or its circuit opened while a claim leased the rest of its rows: nothing
                # starts them this tick (an exhausted channel's circuit is not looked at again).
                if rt.queue and rt.cannot_send(self.monotonic()):
                    held = take_queue(rt)
                self.completer.add(outcomes)
                if held and self.monotonic() < rt.paused_until:
                    self.give_back.hold_back(rt, held)  # their next attempt waits for the whole pause
                elif held:
                    self.give_back.unsendable(rt, held)
                continue
            started: list[tuple[ClaimedRecord, bool]] = []
            rerouted: list[Rerouted] = []
            given_back: list[ClaimedRecord] = []
            if rt.fallback is not None and rt.queue:
                rerouted, given_back = self._failover().reroute(rt)
                self.running += len(rerouted)
            elif rt.queue and rt.cannot_send(self.monotonic()):
                # Claimed by a claim that was already running when the circuit opened (or the
                # provider asked to wait): nothing would ever start them this tick.
                given_back = take_queue(rt)
            while (record := rt.next_startable(self.monotonic())) is not None:
                started.append((record, self._call_started(rt)))
            if started:
                self.send_loop().spawn(self._slot(rt, record, probe) for record, probe in started)
            if rerouted:
                self.last_start = self.monotonic()
                self.send_loop().spawn(self._rerouted(rt, item) for item in rerouted)
            if given_back:
                self.give_back.unsendable(rt, given_back)

    def _send_inline(self, rt: ChannelRuntime, record: ClaimedRecord, out: list[Outcome]) -> Outcome:
        """Send on this thread (an inline provider); its outcome and any records it defers go to ``out``."""
        rt.begin(self.monotonic())
        probe = rt.breaker.probe_in_flight
        outcome = self._outcome(rt, self.executor.send(rt, record), probe)
        returned = self.feedback.account(rt, outcome, self.monotonic())
        out.append(outcome)
        if returned and throttles(outcome):
            # Back in line: given back by _start, on the worker's thread and outside any claim.
            rt.queue.extendleft(reversed(returned))
        elif returned:
            self.give_back.release(returned, "circuit opened before they were sent", log)
        return outcome

    async def _rerouted(self, rt: ChannelRuntime, item: Rerouted) -> None:
        """A record sent straight through its channel's fallback (the channel must not be called now)."""
        outcome, returned = await self._failover().send(rt, item.fallback, item.record, item.why)
        rt.cap.hold(item.record.id_text)
        self.running -= 1
        self._hand_over(Finished(self._outcome(rt, outcome, False), [returned]))

    async def _slot(self, rt: ChannelRuntime, record: ClaimedRecord, probe: bool = False) -> None:
        """One concurrency slot of a channel: send, then keep it busy with the channel's next record
        (``probe``: this first call is its circuit's half-open probe)."""
        loop_time = asyncio.get_running_loop().time
        while True:
            delay = rt.start_delay(loop_time())  # a burst of starts is spread (engine.flow_control)
            if delay > 0:
                await asyncio.sleep(delay)
            # Asked again however short the wait: a start's first step may come a while after the pass
            # that made it a task. Stopped, lost or the channel found disabled meanwhile: back in line,
            # never sent.
            if not self._may_send() or rt.stopped:
                rt.inflight, self.running = rt.inflight - 1, self.running - 1
                if probe:
                    rt.breaker.neutral()  # the probe was not sent: the next one may go
                rt.queue.appendleft(record)
                self.send_loop().signal()
                return
            started = loop_time()
            outcome = await self.executor.send_async(rt, record)
            rt.pacer.observe(loop_time() - started)
            returns: list[Returned] = []
            if rt.fallback is not None and eligible(outcome):
                # The primary's answer feeds the primary's flow control, whatever the fallback does.
                at = self.monotonic()
                returns.append(Returned(rt, outcome, self.feedback.account_safely(rt, outcome, at), at))
                failover = self._failover()
                fallback = failover.reserve(rt, at) if self._may_send(at) else None
                if fallback is not None:
                    self.last_start = self.monotonic()
                    outcome, returned = await failover.send(rt, fallback, record, outcome)
                    returns.append(returned)
            at = self.monotonic()
            if not returns:
                returns.append(Returned(rt, outcome, self.feedback.account_safely(rt, outcome, at), at))
            self.running -= 1
            # Before the slot looks for its next record: a 410 stops the channel's next call too.
            self._hand_over(Finished(self._outcome(rt, outcome, probe), returns))
            # This call no longer counts against the channel's concurrency: at full concurrency the
            # next record would otherwise wait for the dispatcher's next pass to start it. Against
            # the worker's own cap it counts until its outcome is committed (engine.flow_control).
            rt.inflight -= 1
            rt.cap.hold(record.id_text)
            next_record = rt.next_startable(self.monotonic()) if rt.queue and self._may_send() else None
            if next_record is not None:
                record = next_record
                probe = self._call_started(rt)
                continue
            return

    def _failover(self) -> Failover:
        """The failover machinery, built at its first use (a channel with a fallback needs it)."""
        if self.failover is None:
            self.failover = Failover(self.executor, self.feedback, self.monotonic)
        return self.failover

    def _call_started(self, rt: ChannelRuntime) -> bool:
        """A call on ``rt``'s own provider starts now: its rate and concurrency slots, the tick's count.
        True when it is the probe of its half-open circuit."""
        now_mono = self.monotonic()
        rt.begin(now_mono)
        rt.inflight += 1
        self.running += 1
        self.last_start = now_mono
        return rt.breaker.probe_in_flight

    def _hand_over(self, finished: Finished) -> None:
        """A call ended: its outcome waits in :attr:`done`, and the dispatcher's wait ends."""
        self.done.append(finished)
        self.send_loop().signal()

    def collect(self, timeout: float, batch_delay: float, bound: FilteringBoundLogger) -> None:
        """Hand finished calls to the completer, running the send loop up to ``timeout`` for the first one."""
        if not self.done and timeout > 0:
            self.send_loop().wait(timeout)
            # No batching while the worker's cap is full of outcomes waiting for their commit: the
            # delay would hold every slot back (engine.flow_control).
            if self.done and batch_delay > 0 and not self.cap.waiting_for_commit:
                self.send_loop().pause(batch_delay)
        if not self.done:
            return
        finished, self.done = self.done, []
        held, give_back = sort_returns(returned for item in finished for returned in item.returns)
        self.completer.add([item.outcome for item in finished])
        for returned in held:
            self.give_back.hold_back(returned.rt, returned.records, returned.at)
        if give_back:
            self.give_back.release(give_back, "circuit opened before they were sent", bound)
