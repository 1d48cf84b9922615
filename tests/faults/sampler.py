"""What the server sees during the fault test, sampled every few hundred ms from its Unix socket.

Two things: how many rows are Sent (to time the resume after a partition heals), and the worker's
sessions in ``pg_stat_activity`` (to find a transaction left open across a fault). Each sample is tagged
with the fault in force when it was taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

SENT = "SELECT count(*) FROM notifications_retry_notificationentity WHERE status = 'sent'"
# Seconds each of the worker's sessions has been idle in transaction, how old its transaction is, its last
# statement, and whether the transaction holds anything (a lock other than its own id, an xid, a snapshot):
# a transaction that got no further than BEGIN holds nothing another session could wait for.
WORKER_SESSIONS = """
SELECT pid, state,
       coalesce(extract(epoch FROM clock_timestamp() - state_change), 0),
       coalesce(extract(epoch FROM clock_timestamp() - xact_start), 0),
       left(query, 160),
       backend_xid IS NOT NULL OR backend_xmin IS NOT NULL OR EXISTS (
           SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.granted AND l.locktype <> 'virtualxid')
FROM pg_stat_activity a
WHERE client_addr = %s::inet AND backend_type = 'client backend'
"""


@dataclass
class Sample:
    at: float
    phase: str
    sent: int
    idle_in_transaction: float
    #: The same, counting only transactions that hold locks, an xid or a snapshot.
    idle_holding: float
    oldest_transaction: float
    #: The last statement of the session idle in transaction longest (what left the transaction open).
    idle_query: str = ""


@dataclass
class ServerSampler:
    """Poll ``connect()`` every ``interval`` s in a thread; ``phase`` names the fault in force."""

    connect: Callable[[], psycopg.Connection[Any]]
    worker_address: str
    interval: float = 0.2
    phase: str = "clean"
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ServerSampler:
        self._thread = threading.Thread(target=self._run, name="server-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        with self.connect() as db:
            while not self._stop.is_set():
                try:
                    self.samples.append(self._sample(db))
                except psycopg.Error as exc:  # kept for the report; the test's own queries will fail loudly
                    self.errors.append(str(exc))
                self._stop.wait(self.interval)

    def _sample(self, db: psycopg.Connection[Any]) -> Sample:
        phase = self.phase
        sent_row = db.execute(SENT).fetchone()
        sessions = db.execute(WORKER_SESSIONS, [self.worker_address]).fetchall()
        idle = sorted(
            (float(since), query or "", bool(holding))
            for _, state, since, _, query, holding in sessions
            if (state or "").startswith("idle in transaction")
        )
        open_ages = [float(row[3]) for row in sessions]
        return Sample(
            time.monotonic(),
            phase,
            sent_row[0] if sent_row else 0,
            idle[-1][0] if idle else 0.0,
            max((since for since, _, holding in idle if holding), default=0.0),
            max(open_ages, default=0.0),
            idle[-1][1] if idle else "",
        )

    def first_sent_increase_after(self, moment: float) -> float | None:
        """When the Sent count first grew after ``moment`` (a sample's time), or None."""
        before = [s.sent for s in self.samples if s.at <= moment]
        baseline = before[-1] if before else 0
        return next((s.at for s in self.samples if s.at > moment and s.sent > baseline), None)

    def longest_idle_query(self) -> str:
        """The last statement of the session seen idle in transaction the longest."""
        if not self.samples:
            return ""
        return max(self.samples, key=lambda s: s.idle_in_transaction).idle_query

    def longest(self, attribute: str, phases: set[str] | None = None) -> float:
        """The largest ``idle_in_transaction``, ``idle_holding`` or ``oldest_transaction`` (in ``phases``)."""
        return max(
            (getattr(s, attribute) for s in self.samples if phases is None or s.phase in phases), default=0.0
        )
