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
from types import FrameType
from typing import Any

import psycopg
import structlog
from django.db import DatabaseError, transaction

from notifications_retry import events
from notifications_retry.clock import Clock, default_clock
from notifications_retry.conf import get_settings
from notifications_retry.delivery.outbox import mark_published
from notifications_retry.delivery.session import drop_broken_connection
from notifications_retry.locks import dedicated_connection, direct_session_pid
from notifications_retry.models import Outbox
from notifications_retry.outbox.publishers import Publisher, PublishError, get_publisher
from notifications_retry.retry import exponential_delay

log = structlog.get_logger("notifications_retry.relay")

#: First half of the two-int advisory-lock key of every outbox key ("nrob"): apart from other locks.
LOCK_CLASS = 0x6E726F62


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


#: How :class:`~notifications_retry.locks.LockNotDirect` names the relay's locks.
KEY_LOCKS_NAME = "the outbox relay's key locks"


class KeyLocks:
    """Session advisory locks per outbox key, on a connection of their own.

    The locks must outlive the short claim transaction and stay valid through PgBouncer transaction
    pooling, so they live on a direct connection (``LOCK_DATABASE_ALIAS``), like the worker's lock.
    A relay that dies loses its connection, and with it the locks.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._conn: psycopg.Connection[Any] | None = None
        self.held: list[int] = []

    def _connect(self) -> psycopg.Connection[Any]:
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

    def close(self) -> None:
        """Close the connection (releasing whatever it held)."""
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
    ) -> None:
        conf = get_settings()
        self.publisher = publisher
        self.batch_size = batch_size or conf.OUTBOX_RELAY_BATCH_SIZE
        self.interval = conf.OUTBOX_RELAY_INTERVAL_SECONDS if interval is None else interval
        self.max_backoff = conf.OUTBOX_RELAY_MAX_BACKOFF_SECONDS if max_backoff is None else max_backoff
        self.clock = clock or default_clock(conf.CLOCK)
        self.locks = KeyLocks(conf.LOCK_DATABASE_ALIAS)
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait

    def stop(self, *_: Any) -> None:
        """Finish the event in hand, mark what was published, release the locks, return."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the relay gracefully."""

        def handler(signum: int, frame: FrameType | None) -> None:
            log.info("relay-stop-requested", signal=signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def batch(self) -> RelayReport:
        """Claim, publish and mark one batch."""
        report = RelayReport()
        published: list[int] = []
        try:
            with transaction.atomic():
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
                return report
            # Read again once the keys are ours: the authoritative, ordered list of what is left.
            rows = list(
                Outbox.objects.filter(published_at__isnull=True, key__in=owned).order_by("id")[
                    : self.batch_size
                ]
            )
            self._publish(rows, published, report)
        finally:
            try:
                if published:
                    mark_published(published, self.clock.now())
            finally:
                self.locks.release()
        report.published = len(published)
        return report

    def _publish(self, rows: Sequence[Outbox], published: list[int], report: RelayReport) -> None:
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
                    drop_broken_connection()
                    self.locks.close()
                    report = RelayReport(endpoint_down=True)
                reports.append(report)
                log.info("relay-batch", **dataclasses.asdict(report))
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
            self.locks.close()
            self.publisher.close()
        return reports


def run_relay(
    *,
    once: bool,
    publisher: str | None = None,
    options: dict[str, Any] | None = None,
    batch_size: int | None = None,
    interval: float | None = None,
) -> list[RelayReport]:
    """What ``manage.py outbox_relay`` runs: build the publisher from settings and options, relay."""
    conf = get_settings()
    name = publisher or conf.OUTBOX_PUBLISHER
    merged = dict(conf.OUTBOX_PUBLISHER_OPTIONS) if name == conf.OUTBOX_PUBLISHER else {}
    merged.update(options or {})
    relay = Relay(get_publisher(name, merged), batch_size=batch_size, interval=interval)
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
