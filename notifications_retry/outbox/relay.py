"""The outbox relay: publish unpublished events in order of creation, at least once, in order per key.

A batch:

1. claims up to ``batch_size`` unpublished events, oldest first, with ``FOR UPDATE SKIP LOCKED``
   (a short transaction), and takes a session advisory lock per key on a dedicated connection,
   skipping keys another relay holds;
2. re-reads the unpublished events of the keys it locked, in order of creation;
3. publishes them with no transaction open, one by one (or, to a publisher that pipelines, in waves
   of at most one event per key); after the first failure of a key the later events of that key are
   not tried, and a failure that says the endpoint is down ends the batch;
4. marks the published ones in one short transaction, and releases the key locks.

A crash between 3 and 4 leaves the events unpublished: the next run publishes them again (at least
once; consumers drop duplicates by ``event_id``). Nothing is ever marked published unless the
publisher accepted it, so a crash never skips an event. The key locks make concurrent relays safe:
one key is only ever published by one relay at a time, so its events keep their order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from types import FrameType
from typing import Any

import psycopg
import structlog
from django.db import DatabaseError, connection, transaction

from notifications_retry.conf import get_settings
from notifications_retry.database.locks import AdvisoryLock, dedicated_connection, direct_session_pid
from notifications_retry.delivery import events
from notifications_retry.delivery.events import mark_published
from notifications_retry.delivery.session import bound_transaction, drop_broken_connection
from notifications_retry.models import Outbox
from notifications_retry.observability import metrics
from notifications_retry.observability.heartbeat_file import HeartbeatFile
from notifications_retry.outbox.publishers import Publisher, PublishError, get_publisher
from notifications_retry.rules.backoff import exponential_delay
from notifications_retry.runtime.clock import Clock, default_clock

log = structlog.get_logger("notifications_retry.relay")

#: What a relay's heartbeat file names as its writer (``outbox_relay --heartbeat-file``).
HEARTBEAT_NAME = "outbox-relay"

#: First half of the two-int advisory-lock key of every outbox key ("nrob"): apart from other locks.
LOCK_CLASS = 0x6E726F62
#: Events one batch claims and publishes; they are marked published together after it, so a crash
#: publishes at most this many again; 100 keeps a batch's key locks and its marking short statements
#: (``outbox_relay --batch-size`` sets it for that process).
OUTBOX_RELAY_BATCH_SIZE = 100
#: The most events a worker's relay batch takes, whatever the worker's ``--batch-size``: a batch holds an
#: advisory lock per key on the worker's session, and PostgreSQL's shared lock table holds about
#: ``max_locks_per_transaction`` (64) times ``max_connections`` (100) locks on defaults; 5,000 keys of one
#: batch ended in "out of shared memory". The relay runs batch after batch between ticks to keep up.
RELAY_TASK_BATCH_MAX = 500
#: The relay's pause once the outbox is drained: an event is published about this long after it is
#: written (``outbox_relay --interval``; a worker relays after each tick too).
OUTBOX_RELAY_INTERVAL_SECONDS = 1.0
#: The longest pause while the publisher's endpoint is down (the pause doubles from the interval up to
#: this): a broker that comes back is used within a minute, and one that stays away costs a try a minute.
OUTBOX_RELAY_MAX_BACKOFF_SECONDS = 60.0
#: The most often the outbox gauges are read (about a scrape interval).
GAUGE_SECONDS = 10.0
#: In ``retry_worker``: the most one turn of its loop spends relaying (its database steps: claim, key
#: locks, marking), and the most of the loop's time relaying takes while events keep waiting.
TURN_SECONDS = 0.5
SHARE = 0.5
#: How soon ``retry_worker`` looks again whether its relay's batch in flight has been published (doubling
#: up to the second figure while it is not).
PUBLISH_POLL_SECONDS = 0.01
PUBLISH_POLL_MAX_SECONDS = 0.5
#: In ``retry_worker``, once the outbox is drained: the relay looks again after its interval, then less
#: often (doubling up to this) with one index probe a look. A tick that settled rows has it look at
#: once (:meth:`LoopTasks.nudge <notifications_retry.engine.loop_tasks.LoopTasks.nudge>`), so the worker's
#: own events go out promptly. While the worker waits between ticks, its poll looks instead
#: (:meth:`RelayTask.outbox_seen`), so these looks are the busy worker's.
IDLE_LOOK_MAX_SECONDS = 5.0
#: How long a stopping worker waits for its relay's batch in flight (which ends after the event in hand)
#: before it gives up marking it; and how long the batch taken after ``--once``'s tick has to finish.
STOP_WAIT_SECONDS = 0.25
FINISH_WAIT_SECONDS = 10.0


@dataclasses.dataclass
class RelayReport:
    """What one batch did."""

    claimed: int = 0
    published: int = 0
    failed: int = 0
    held_elsewhere: int = 0
    blocked_keys: list[str] = dataclasses.field(default_factory=list)
    endpoint_down: bool = False
    stopped: bool = False

    @property
    def unpublished_left_behind(self) -> bool:
        """Some claimable event stayed unpublished because publishing failed."""
        return bool(self.blocked_keys)


#: How :class:`~notifications_retry.database.locks.LockNotDirect` names the relay's locks.
KEY_LOCKS_NAME = "the outbox relay's key locks"


class KeyLocks:
    """Session advisory locks per outbox key, on a connection of their own or on the worker's lock's.

    The locks must outlive the short claim transaction and stay valid through PgBouncer transaction
    pooling, so they live on a direct connection (``LOCK_DATABASE_ALIAS``), like the worker's lock.
    A relay that dies loses its connection, and with it the locks. In ``retry_worker`` they live on the
    cycle lock's own session (``session``, proven direct), so relaying adds no connection to the worker.
    """

    def __init__(self, using: str = "default", *, session: AdvisoryLock | None = None) -> None:
        self.using = using
        self.session = session
        self._conn: psycopg.Connection[Any] | None = None
        self.held: list[int] = []

    def _connect(self) -> psycopg.Connection[Any]:
        if self.session is not None:
            return self.session.session()
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._conn = dedicated_connection(self.using, "notifications_retry relay")
        # Key locks are session advisory locks too: refuse a pooled session as the worker's lock does.
        direct_session_pid(self._conn, self.using, lock=KEY_LOCKS_NAME)
        return self._conn

    def acquire(self, keys: Sequence[str]) -> set[str]:
        """Lock what can be locked now, without waiting; returns the keys this relay owns."""
        if not keys:
            return set()
        conn = self._connect()
        # One lock per distinct hash: two keys sharing a hash are simply relayed by the same owner.
        rows = conn.execute(
            "SELECT h, pg_try_advisory_lock(%s::int, h) FROM (SELECT DISTINCT hashtext(k) AS h "
            "FROM unnest(%s::text[]) AS k) AS hashes",
            (LOCK_CLASS, list(keys)),
        ).fetchall()
        granted = {int(h) for h, ok in rows if ok}
        self.held.extend(granted)
        hashes = dict(
            conn.execute("SELECT k, hashtext(k) FROM unnest(%s::text[]) AS k", (list(keys),)).fetchall()
        )
        return {k for k in keys if hashes[k] in granted}

    def release(self) -> None:
        """Release every key lock (a dead connection has released them already)."""
        held, self.held = self.held, []
        if not held or self._conn is None or self._conn.closed:
            return
        try:
            self._conn.execute(
                "SELECT pg_advisory_unlock(%s::int, h) FROM unnest(%s::int[]) AS h", (LOCK_CLASS, held)
            )
        except psycopg.Error:
            self.close()
            if self.session is not None:
                self.session.close()  # the locks may still be held: end the session that holds them

    def close(self) -> None:
        """Close the connection (releasing whatever it held); on a shared session, release the locks."""
        if self.session is not None:
            self.release()
            return
        self.held = []
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None


class Relay:
    """Moves events from the outbox to a publisher; ``run()`` loops, ``run(once=True)`` drains."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        batch_size: int | None = None,
        interval: float | None = None,
        max_backoff: float | None = None,
        clock: Clock | None = None,
        sleep: Callable[[float], None] | None = None,
        heartbeat_file: str | None = None,
        wall: Callable[[], float] = time.time,
        locks: KeyLocks | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        conf = get_settings()
        self.publisher = publisher
        #: This process's own heartbeat on disk, written after every batch: a pod's liveness probe
        #: (``outbox_relay --check --heartbeat-file``) reads it.
        self.heartbeat = HeartbeatFile(heartbeat_file, lane=HEARTBEAT_NAME) if heartbeat_file else None
        self.wall = wall
        self.batch_size = batch_size or OUTBOX_RELAY_BATCH_SIZE
        self.interval = OUTBOX_RELAY_INTERVAL_SECONDS if interval is None else interval
        self.max_backoff = OUTBOX_RELAY_MAX_BACKOFF_SECONDS if max_backoff is None else max_backoff
        self.clock = clock or default_clock(conf.CLOCK)
        self.locks = locks if locks is not None else KeyLocks(conf.LOCK_DATABASE_ALIAS)
        self.monotonic = monotonic
        self._gauges_at: float | None = None
        self._stop = threading.Event()
        #: The signal that asked for the stop, logged by the loop (not by the handler).
        self._stop_signal = ""
        self._sleep = sleep or self._stop.wait

    def stop(self, *_: Any) -> None:
        """Finish the event in hand, mark what was published, release the locks, return."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the relay gracefully."""

        def handler(signum: int, frame: FrameType | None) -> None:
            # Only the flag: a handler that logs could wait forever on the logger's lock, held by the
            # line the signal interrupted. The loop logs the stop when it sees the flag.
            self._stop_signal = signal.Signals(signum).name
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def batch(self) -> RelayReport:
        """Claim, publish and mark one batch."""
        report = RelayReport()
        published: list[int] = []
        try:
            self.publish(self.take(report), published, report)
        finally:
            self.settle(published, report)
        return report

    def waiting(self) -> bool:
        """Whether an event waits to be published: one probe of the unpublished index, no transaction."""
        return Outbox.objects.filter(published_at__isnull=True).exists()

    def take(self, report: RelayReport) -> list[Outbox]:
        """Steps 1 and 2 of a batch: the events to publish, their keys locked (:meth:`settle` releases
        them, whatever happens)."""
        with transaction.atomic():
            # Bounded as the worker's own transactions are: one stranded by a network partition holds its
            # rows' locks, and the server ends it after the bound instead of the connection's timeouts.
            with connection.cursor() as cursor:
                bound_transaction(cursor)
            claimed = list(
                Outbox.objects.filter(published_at__isnull=True)
                .order_by("id")
                .select_for_update(skip_locked=True)
                .values_list("key", flat=True)[: self.batch_size]
            )
        report.claimed = len(claimed)
        keys = list(dict.fromkeys(claimed))
        owned = self.locks.acquire(keys)
        report.held_elsewhere = len(keys) - len(owned)
        if not owned:
            return []
        # Read again once the keys are ours: the authoritative, ordered list of what is left.
        return list(
            Outbox.objects.filter(published_at__isnull=True, key__in=owned).order_by("id")[: self.batch_size]
        )

    def settle(self, published: list[int], report: RelayReport) -> None:
        """Step 4 of a batch: mark the ``published`` events, and release the key locks."""
        try:
            if published:
                mark_published(published, self.clock.now())
        finally:
            self.locks.release()
        report.published = len(published)

    def publish(self, rows: Sequence[Outbox], published: list[int], report: RelayReport) -> None:
        """Step 3 of a batch: hand ``rows`` to the publisher (no database: any thread may run it),
        appending the ids it accepted to ``published``."""
        if self.publisher.pipelines:
            self._publish_in_waves(rows, published, report)
            return
        blocked: set[str] = set()
        for event in rows:
            if self._stop.is_set():
                report.stopped = True
                return
            if event.key in blocked:
                continue  # a later event of a failed key waits: order per key
            try:
                self.publisher.publish(events.envelope(event))
            except PublishError as exc:
                report.failed += 1
                blocked.add(event.key)
                report.blocked_keys.append(event.key)
                self._log_failure(event, exc)
                if exc.endpoint_down:
                    report.endpoint_down = True
                    return
                continue
            published.append(event.id)

    def _publish_in_waves(self, rows: Sequence[Outbox], published: list[int], report: RelayReport) -> None:
        """Hand a pipelining publisher the batch in waves of at most one event per key.

        A wave is all in flight at once; a key's next event waits for the next wave, so a key whose
        event failed never has a later event out before it (order per key holds as one by one).
        """
        blocked: set[str] = set()
        pending = list(rows)
        while pending:
            if self._stop.is_set():
                report.stopped = True
                return
            wave: list[Outbox] = []
            later: list[Outbox] = []
            in_wave: set[str] = set()
            for event in pending:
                if event.key in blocked:
                    continue
                if event.key in in_wave:
                    later.append(event)
                else:
                    in_wave.add(event.key)
                    wave.append(event)
            if not wave:
                return
            outcomes = self.publisher.publish_many([events.envelope(event) for event in wave])
            for event, error in zip(wave, outcomes, strict=False):
                if error is None:
                    published.append(event.id)
                    continue
                report.failed += 1
                blocked.add(event.key)
                report.blocked_keys.append(event.key)
                report.endpoint_down = report.endpoint_down or error.endpoint_down
                self._log_failure(event, error)
            if report.endpoint_down or len(outcomes) < len(wave):
                report.endpoint_down = True
                return
            pending = later

    def _log_failure(self, event: Outbox, error: PublishError) -> None:
        metrics.TASK_FAILURES.labels(RelayTask.name).inc()
        log.warning(
            "outbox-publish-failed",
            event_id=str(event.event_id),
            key=event.key,
            generation=event.generation,
            error=str(error),
            endpoint_down=error.endpoint_down,
        )

    def run(self, once: bool = False) -> list[RelayReport]:
        """Loop until stopped (or, with ``once``, until nothing more can be published now)."""
        reports: list[RelayReport] = []
        down_in_a_row = 0
        try:
            while not self._stop.is_set():
                self.clock.sync()
                try:
                    report = self.batch()
                except (DatabaseError, psycopg.Error):
                    log.exception("relay-batch-failed")
                    metrics.TASK_FAILURES.labels(RelayTask.name).inc()
                    drop_broken_connection()
                    self.locks.close()
                    report = RelayReport(endpoint_down=True)
                reports.append(report)
                log.info("relay-batch", **dataclasses.asdict(report))
                self.refresh_gauges()
                if self.heartbeat is not None:
                    self.heartbeat.try_beat(self.wall(), None, log)
                drained = report.published == 0 or report.claimed < self.batch_size
                if once and (drained or report.failed or report.endpoint_down):
                    break
                if report.endpoint_down:
                    down_in_a_row += 1
                    self._sleep(exponential_delay(down_in_a_row, self.interval, self.max_backoff))
                    continue
                down_in_a_row = 0
                if drained or report.failed:
                    self._sleep(self.interval)
        finally:
            if self._stop_signal:
                log.info("relay-stop-requested", signal=self._stop_signal)
            self.close()
        return reports

    def refresh_gauges(self) -> None:
        """Set the outbox gauges, at most every :data:`GAUGE_SECONDS` (a read of the unpublished index)."""
        now = self.monotonic()
        if self._gauges_at is not None and now - self._gauges_at < GAUGE_SECONDS:
            return
        self._gauges_at = now
        try:
            set_outbox_gauges(self.clock.now())
        except DatabaseError as exc:
            log.warning("outbox-gauges-failed", error=repr(exc)[:300])

    def close(self) -> None:
        """Release the key locks (closing their own connection, if they have one) and the publisher."""
        try:
            self.locks.close()
        finally:
            self.publisher.close()


def set_outbox_gauges(now: datetime) -> None:
    """Read the outbox's backlog and set its gauges (``outbox_relay``'s; ``retry_worker`` has its own)."""
    backlog = Outbox.objects.backlog(now)
    metrics.OUTBOX_UNPUBLISHED.set(backlog.unpublished)
    metrics.OUTBOX_OLDEST_UNPUBLISHED_AGE.set(backlog.oldest_unpublished_age_seconds)


def configured_publisher() -> Publisher:
    """The publisher the settings name: ``OUTBOX_PUBLISHER`` with ``OUTBOX_PUBLISHER_OPTIONS`` (ValueError
    with the reason when it cannot be built)."""
    conf = get_settings()
    return get_publisher(conf.OUTBOX_PUBLISHER, dict(conf.OUTBOX_PUBLISHER_OPTIONS))


def relay_task(lock: AdvisoryLock, *, clock: Clock, batch_size: int) -> RelayTask:
    """``retry_worker``'s relay: the configured publisher, its key locks on the worker's ``lock`` session,
    batches at least as large as the worker's ticks (``batch_size``: a tick writes about one event a
    record), so that it keeps up with one batch a tick during a drain."""
    relay = Relay(configured_publisher(), clock=clock, locks=KeyLocks(lock.using, session=lock))
    relay.batch_size = min(max(relay.batch_size, batch_size), RELAY_TASK_BATCH_MAX)
    return RelayTask(relay)


class RelayTask:
    """The relay as a task of ``retry_worker``'s loop (``engine.loop_tasks``): no process of its own.

    The database's steps of a batch (claim, key locks, marking) run on the worker's thread between its
    ticks, the key locks on the cycle lock's session: relaying adds no connection to the worker. The
    publisher's calls run on a thread of their own, so a slow or unreachable publisher never holds the
    sends up: the next turn marks what it accepted and takes the next batch. An event therefore waits
    about ``interval`` (less while events keep coming) plus, during a drain, the tick in progress.
    While the publisher is down, batches back off (doubling from ``interval`` up to ``max_backoff``).
    Once the outbox is drained it looks less often (up to :data:`IDLE_LOOK_MAX_SECONDS`, a probe a
    look) until a tick that settled rows has it look at once; while the worker waits between ticks, the
    wait's poll looks for it (:meth:`outbox_seen`), in the statement that asks when a row falls due.
    """

    name = "relay"
    first_in = 0.0
    budget_seconds = TURN_SECONDS
    share = SHARE

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.retry_seconds = relay.interval
        self.retry_cap_seconds = relay.max_backoff
        self._down_in_a_row = 0
        #: Looks in a row that found the outbox drained (0: the last one took events).
        self._drained_in_a_row = 0
        self._pending: _Publishing | None = None

    def run(self, budget: float) -> float:
        """Mark the batch in flight once published, then take the next; seconds until the next turn.
        Raises the database's errors and a publisher's unexpected ones (the loop backs off)."""
        if self._pending is not None:
            if not self._pending.done.wait(0):
                # Looked at again soon, then less often while a slow publisher works through its batch.
                self._pending.polls += 1
                return exponential_delay(
                    self._pending.polls + 1, PUBLISH_POLL_SECONDS, PUBLISH_POLL_MAX_SECONDS
                )
            report = self._settle()
            if report.endpoint_down:
                self._down_in_a_row += 1
                return exponential_delay(self._down_in_a_row, self.relay.interval, self.relay.max_backoff)
            self._down_in_a_row = 0
            if report.failed or report.published == 0 or report.claimed < self.relay.batch_size:
                return self.relay.interval  # drained, or a key waits for its failed event
        return self._take()

    def _take(self) -> float:
        if self._drained_in_a_row:
            if not self.relay.waiting():
                self._drained_in_a_row += 1
                return self._idle_delay()
            self._drained_in_a_row = 0  # events wait: back to the interval whatever this take gets
        report = RelayReport()
        try:
            rows = self.relay.take(report)
        except BaseException:
            self._release_after_error()
            raise
        if not rows:
            self.relay.settle([], report)
            self._drained_in_a_row += 1
            return self._idle_delay()
        self._drained_in_a_row = 0
        self._pending = _Publishing(self.relay, rows, report)
        return PUBLISH_POLL_SECONDS

    def outbox_seen(self, waiting: bool) -> float | None:
        """The worker's wait looked at the outbox for this task (its poll, engine.wakeup): seconds until
        this task's next turn, or None when the look changes nothing (a batch in flight, a publisher
        backing off, events still being taken). A drained outbox counts as this task's own look (it
        looks no more itself while the worker waits); an event waiting makes it take at once."""
        if self._pending is not None or self._down_in_a_row or not self._drained_in_a_row:
            return None
        if waiting:
            self._drained_in_a_row = 0  # straight to a take: the probe was just made
            return 0.0
        self._drained_in_a_row += 1
        return self._idle_delay()

    def _idle_delay(self) -> float:
        """The pause after the outbox was found drained this many looks in a row."""
        cap = max(IDLE_LOOK_MAX_SECONDS, self.relay.interval)
        return exponential_delay(self._drained_in_a_row, self.relay.interval, cap)

    def _settle(self) -> RelayReport:
        pending, self._pending = self._pending, None
        assert pending is not None
        try:
            self.relay.settle(pending.published, pending.report)
        except BaseException:
            self._release_after_error()
            raise
        report = pending.report
        if report.published or report.failed or report.endpoint_down:
            log.info("relay-batch", **dataclasses.asdict(report))
        if pending.error is not None:
            raise pending.error
        return report

    def _release_after_error(self) -> None:
        drop_broken_connection()
        with contextlib.suppress(psycopg.Error):
            self.relay.locks.release()

    def stop(self) -> None:
        """The worker stops: the publisher's thread ends after the event in hand."""
        self.relay.stop()

    def close(self) -> None:
        """Mark what the batch in flight published, release the key locks and close the publisher.

        The batch gets :data:`FINISH_WAIT_SECONDS` to finish (after ``--once``'s tick), or, once the worker
        was asked to stop (it then ends after the event in hand), :data:`STOP_WAIT_SECONDS`. A batch still
        publishing after that is left unmarked: its events are published again later (at least once)."""
        wait = STOP_WAIT_SECONDS if self.relay.stopping else FINISH_WAIT_SECONDS
        try:
            if self._pending is not None and self._pending.done.wait(wait):
                with contextlib.suppress(Exception):
                    self._settle()
            self._pending = None
        finally:
            self.relay.stop()
            self.relay.close()


class _Publishing:
    """One batch's publishing, on a daemon thread (it must not keep a stopping process alive)."""

    def __init__(self, relay: Relay, rows: Sequence[Outbox], report: RelayReport) -> None:
        self.report = report
        self.published: list[int] = []
        self.error: BaseException | None = None
        #: How often the worker found it still publishing.
        self.polls = 0
        self.done = threading.Event()
        self.thread = threading.Thread(
            target=self._run, args=(relay, rows), name="notifications-retry-relay", daemon=True
        )
        self.thread.start()

    def _run(self, relay: Relay, rows: Sequence[Outbox]) -> None:
        try:
            relay.publish(rows, self.published, self.report)
        except BaseException as exc:  # handed to the worker's thread, which logs and backs off
            self.error = exc
        finally:
            self.done.set()


def run_relay(
    *,
    once: bool,
    publisher: str | None = None,
    options: dict[str, Any] | None = None,
    batch_size: int | None = None,
    interval: float | None = None,
    heartbeat_file: str | None = None,
) -> list[RelayReport]:
    """What ``manage.py outbox_relay`` runs: build the publisher from settings and options, relay."""
    conf = get_settings()
    name = publisher or conf.OUTBOX_PUBLISHER
    merged = dict(conf.OUTBOX_PUBLISHER_OPTIONS) if name == conf.OUTBOX_PUBLISHER else {}
    merged.update(options or {})
    relay = Relay(
        get_publisher(name, merged), batch_size=batch_size, interval=interval, heartbeat_file=heartbeat_file
    )
    relay.install_signal_handlers()
    started = time.monotonic()
    reports = relay.run(once=once)
    log.info(
        "relay-stopped",
        batches=len(reports),
        published=sum(r.published for r in reports),
        seconds=round(time.monotonic() - started, 3),
    )
    return reports
