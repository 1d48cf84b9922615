"""The advisory locks a worker holds, and how long a held lock can be trusted.

- :class:`AdvisoryLock`: the cycle's single-owner lock, a PostgreSQL session advisory lock on a
  dedicated, direct connection (:func:`dedicated_connection`); a waiting worker LISTENs on its session.
- :func:`lane_lock` and :class:`PartitionLock`: the lock a lane's worker ticks under, the lane's one
  lock, or with ``PARTITIONS`` above 1 its share of the lane's partitions, each with a lock of its own.
- :class:`Ownership`: whether a send may still start, the lock seen held lately.

A session lock dies with its connection, so a killed owner frees it at once; the connection's
``idle_session_timeout`` and TCP keepalives bound how long a hung owner can keep it. Both hold only on a
session of its own, straight to PostgreSQL: behind a pooler (PgBouncer in transaction mode) consecutive
statements run on different server sessions, the lock can be stranded on a pooled session, and a ``SET``
would leak onto other clients' sessions. So the lock proves its session is direct before it takes the
lock and at every acquisition, and raises :class:`LockNotDirect` otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from django.db import connections

from notifications_retry.conf import DEFAULT_LANE
from notifications_retry.database.tcp_settings import TCP_SETTINGS

if TYPE_CHECKING:
    import random

    from notifications_retry.conf import RetrySettings

logger = logging.getLogger(__name__)

LOCK_APPLICATION_NAME = "notifications_retry lock"

#: The lock session's ``idle_session_timeout``: the server closes a hung owner's session, and so frees
#: its lock for a standby, within this time. A live worker's lock session is never idle that long (it
#: asks for the next due time at least every few seconds), and a standby takes over a hung owner's
#: rows within a minute and a half.
LOCK_IDLE_SESSION_TIMEOUT_SECONDS = 90

#: PgBouncer's answer to a startup parameter it does not pass on (``options`` carries our settings).
_POOLER_STARTUP_REFUSAL = "unsupported startup parameter"

_SETTINGS_AND_KEY = """
SELECT extract(epoch FROM current_setting('idle_session_timeout')::interval)::bigint, hashtextextended(%s, 0)
"""

# The lock as pg_locks lists it: a bigint key is split into classid (high half) and objid (low half).
_LOCK_LISTED = """
SELECT pg_backend_pid(), count(*) FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1
  AND ((classid::bigint << 32) | objid::bigint) = %s
"""


class LockNotDirect(RuntimeError):
    """The lock's connection is not one PostgreSQL session of its own (a pooler or proxy is in between).

    Not retried: the configuration must change. The message names the lock (the worker's cycle lock,
    or the relay's key locks) and the setting to fix.
    """

    def __init__(self, using: str, reason: str, *, lock: str = "the cycle's advisory lock") -> None:
        self.using = using
        self.reason = reason
        self.lock = lock
        super().__init__(
            f"{lock} must live on a direct PostgreSQL session, but database alias {using!r} "
            f"does not give one: {reason}. Set NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS'] to a DATABASES "
            "entry that connects to PostgreSQL directly, not through PgBouncer or another pooler "
            "(see docs/operations.md, 'PgBouncer and the advisory lock')."
        )


def _options_value(settings: Mapping[str, str]) -> str:
    # libpq's ``options`` is split on whitespace; a backslash keeps a space inside a value.
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace(" ", "\\ ")

    return " ".join(f"-c {escape(name)}={escape(value)}" for name, value in settings.items())


def dedicated_connection(
    using: str, application_name: str, *, session_settings: Mapping[str, str] | None = None
) -> psycopg.Connection[Any]:
    """An autocommit connection of its own to database ``using``, with TCP keepalives.

    Session advisory locks live on it: a fresh wrapper gives Django's connection parameters without
    sharing Django's connection, and keepalives let the server notice a vanished owner.

    With ``session_settings``, they and the application name travel in the startup packet's ``options``
    (after any ``options`` of the alias), so they apply to this session only: never a ``SET`` that could
    outlive it on a pooled server session. A pooler refuses or drops ``options``, so not even the name
    reaches a pooled session (PgBouncer passes a plain ``application_name`` on to the next client).
    """
    params = connections.create_connection(using).get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["autocommit"] = True
    for key, value in TCP_SETTINGS.items():
        params.setdefault(key, value)  # a value the alias's OPTIONS give wins
    if session_settings is None:
        params["application_name"] = application_name
    else:
        params.pop("application_name", None)
        ours = _options_value({"application_name": application_name, **session_settings})
        params["options"] = " ".join(part for part in (params.get("options") or "", ours) if part)
    return psycopg.connect(**params)


def direct_session_pid(
    conn: psycopg.Connection[Any], using: str, *, lock: str = "the cycle's advisory lock"
) -> int:
    """The backend pid of ``conn``, once shown to be one PostgreSQL session of its own; else LockNotDirect.

    A direct session's backend pid is the one the server announced in its BackendKeyData at connect time;
    a pooler (PgBouncer, in any pool mode) announces a key of its own, so the two differ. Two consecutive
    statements must also run in that one server process. Any holder of session advisory locks (the
    outbox relay's key locks too) can prove its connection with this before locking; ``lock`` names it
    in the error.
    """
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid, announced = int(row[0]), conn.info.backend_pid
    if pid != announced:
        raise LockNotDirect(
            using,
            f"the server process running the lock's statements (pid {pid}) is not the one the "
            f"connection was opened with (pid {announced}), as through a pooler",
            lock=lock,
        )
    again = conn.execute("SELECT pg_backend_pid()").fetchone()
    if again is None or int(again[0]) != pid:
        raise LockNotDirect(
            using, "two consecutive statements ran in different server processes (a pooler)", lock=lock
        )
    return pid


class AdvisoryLock:
    """``pg_try_advisory_lock(hashtextextended(name, 0))`` held on a direct connection of its own."""

    def __init__(
        self,
        name: str,
        *,
        using: str = "default",
        idle_session_timeout: int = LOCK_IDLE_SESSION_TIMEOUT_SECONDS,
    ) -> None:
        self.name = name
        self.using = using
        self.idle_session_timeout = int(idle_session_timeout)
        self._conn: psycopg.Connection[Any] | None = None
        self._key: int | None = None
        # The server process of the proven session: every later statement must run there.
        self._pid: int | None = None
        self.held = False
        #: Why the last ``acquire`` could not ask PostgreSQL (None: it asked, whatever the answer).
        self.last_error: psycopg.Error | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = dedicated_connection(
                self.using,
                LOCK_APPLICATION_NAME,
                session_settings={"idle_session_timeout": f"{self.idle_session_timeout}s"},
            )
        except psycopg.OperationalError as exc:
            if _POOLER_STARTUP_REFUSAL in str(exc):
                raise LockNotDirect(
                    self.using, f"the server refused the session's startup settings ({exc})"
                ) from exc
            raise
        try:
            self._pid, self._key = self._prove_direct(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _prove_direct(self, conn: psycopg.Connection[Any]) -> tuple[int, int]:
        """The session's backend pid and the lock key, once the session is shown to be direct.

        Besides :func:`direct_session_pid`: a pooler that drops the startup ``options`` shows as a
        session without the ``idle_session_timeout`` given there.
        """
        pid = direct_session_pid(conn, self.using)
        row = conn.execute(_SETTINGS_AND_KEY, (self.name,)).fetchone()
        assert row is not None
        timeout, key = int(row[0]), int(row[1])
        if timeout != self.idle_session_timeout:
            raise LockNotDirect(
                self.using,
                f"the session's idle_session_timeout is {timeout}s, not the {self.idle_session_timeout}s "
                "given at connect time: something between the worker and PostgreSQL dropped it",
            )
        return pid, key

    def prove_direct(self) -> bool:
        """Open the lock's connection and prove it direct now (at worker start).

        Raises :class:`LockNotDirect` when it is not; False when the database cannot be reached now (the
        next acquisition proves it again); True when the session is direct.
        """
        try:
            self._connect()
        except psycopg.Error:
            logger.warning("advisory lock connection failed; its session is proven at the next tick")
            self._discard()
            return False
        return True

    def session(self) -> psycopg.Connection[Any]:
        """The lock's connection, opened and proven direct if it is not open: a waiting worker LISTENs
        on it (engine.wakeup), as a pooled session cannot."""
        return self._connect()

    @property
    def key(self) -> int:
        """The bigint advisory-lock key of ``name`` (computed by PostgreSQL)."""
        self._connect()
        assert self._key is not None
        return self._key

    def acquire(self) -> bool:
        """Try to take the lock without waiting; True when this process owns the cycle.

        Raises :class:`LockNotDirect` when the connection is not a direct session (a configuration
        error: the worker must stop). A connection failure only skips this tick (False).
        """
        try:
            conn = self._connect()
            row = conn.execute("SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (self._key,)).fetchone()
            assert row is not None
            got, pid = bool(row[0]), int(row[1])
            listed: tuple[Any, ...] | None = None
            if got:
                listed = conn.execute(_LOCK_LISTED, (self._key,)).fetchone()
        except psycopg.Error as exc:
            self.last_error = exc
            self._discard()
            return False
        self._same_session(pid, "the lock was tried")
        if got and (listed is None or int(listed[0]) != pid or not listed[1]):
            self._abandon()
            raise LockNotDirect(
                self.using,
                f"PostgreSQL granted the lock to server process {pid}, but the next statement "
                "does not see it held there (pg_locks)",
            )
        self.held = got
        return self.held

    def still_held(self) -> bool:
        """Whether the lock is still ours: the connection is alive and PostgreSQL lists the lock."""
        if not self.held or self._conn is None or self._conn.closed:
            return False
        try:
            row = self._conn.execute(_LOCK_LISTED, (self._key,)).fetchone()
        except psycopg.Error:
            self._discard()
            return False
        if row is None or int(row[0]) != self._pid:
            logger.error("advisory lock session changed under the worker; the lock is lost")
            self._abandon()
            return False
        self.held = bool(row[1])
        return self.held

    def release(self) -> None:
        """Release the lock; a dead connection has released it already."""
        if not self.held:
            return
        self.held = False
        try:
            if self._conn is not None and not self._conn.closed:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        except psycopg.Error:
            self._discard()

    def close(self) -> None:
        """Release and close the dedicated connection."""
        self.release()
        self._discard()

    def _same_session(self, pid: int, doing: str) -> None:
        """Raise LockNotDirect (the session abandoned) when ``pid`` is not the session proven at connect
        time: a pooler handed the statement to another server process."""
        if pid != self._pid:
            self._abandon()
            raise LockNotDirect(
                self.using,
                f"{doing} in server process {pid}, not in the session proven at connect time "
                f"(pid {self._pid})",
            )

    def _abandon(self) -> None:
        # The session is not what was proven: unlock on whatever session answers, then drop it.
        if self._conn is not None and not self._conn.closed:
            with contextlib.suppress(psycopg.Error):
                self._conn.execute("SELECT pg_advisory_unlock_all()")
        self._discard()

    def _discard(self) -> None:
        self.held = False
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None
        self._pid = None


# --------------------------------------------------------------------------------------------------
# Partitions of a lane's backlog, one owner each: the advisory locks that let identical workers share it,
# and whether a send may still start under them (:class:`Ownership`, below).
#
# With ``PARTITIONS`` = N above 1, every notification belongs to partition
# ``hash(id) mod N`` (computed in the claim's SQL: ``delivery.claim_statements.PARTITION_OF``), and
# partition p has an advisory lock of its own, derived from the lane's lock name. A worker owns the
# partitions whose locks it took, and its ticks claim only their rows: one owner per partition's cycle, as
# one owner per lane's cycle with a single partition (N = 1 is exactly the lane's one lock, so a single
# worker's deployment is unchanged).
#
# How many workers are alive: each holds a *shared* advisory lock on the lane's presence key for as long
# as its lock session lives, so ``pg_locks`` lists one holder per live worker. A killed worker's session
# ends and takes its presence and its partitions with it; a hung one's is ended by the server's
# ``idle_session_timeout``. No table, no heartbeat to expire: the database's own view of the sessions.
#
# A worker takes at most its fair share, ``ceil(N / live workers)``, of the free partitions, and keeps
# them from one tick to the next (so a partition is free only when its owner died or gave it back).
# Every ``engine.dispatcher.LOCK_CHECK_SECONDS`` a tick looks again (one ``pg_locks`` statement, which
# also proves its locks held), and between ticks every :data:`RETRY_SECONDS`: when the worker holds more
# than its share (a worker joined), or less while a partition is free (a worker died),
# :attr:`PartitionLock.rebalance_due` ends the tick, or starts the next, which takes its share afresh.
# --------------------------------------------------------------------------------------------------

#: Between ticks, how often a worker short of its fair share tries again to take free partitions.
RETRY_SECONDS = 2.0

# Every lock of this lane's partitions and its presence key that anyone holds, with the asking session's
# pid (a row with null key when none is held): advisory locks are per database.
_SNAPSHOT = """
SELECT pg_backend_pid(), l.key, l.pid, l.mode
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT ((classid::bigint << 32) | objid::bigint) AS key, pid, mode FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((classid::bigint << 32) | objid::bigint) = ANY(%s::bigint[])
) AS l ON true
"""

_KEYS = "SELECT hashtextextended(n, 0) FROM unnest(%s::text[]) WITH ORDINALITY AS u(n, i) ORDER BY i"


def lock_names(base: str, partitions: int) -> list[str]:
    """The advisory lock names of a lane's partitions: the lane's own lock when there is one partition."""
    if partitions == 1:
        return [base]
    return [f"{base}:partition:{p}" for p in range(partitions)]


def presence_name(base: str) -> str:
    """The name of the lane's presence key, held shared by every live worker of the lane."""
    return f"{base}:workers"


def fair_share(partitions: int, workers: int) -> int:
    """The most partitions one of ``workers`` live workers may hold: ``ceil(partitions / workers)``."""
    return math.ceil(partitions / max(1, workers))


def lane_lock(conf: RetrySettings, lane: str, rng: random.Random) -> AdvisoryLock:
    """The lock a worker of ``lane`` ticks under. One partition: the lane's one lock, exactly as a
    single worker always had it. More: a lock per partition, and workers share the lane's rows by
    partition (``rng`` picks the partition a worker tries first, so workers starting together spread)."""
    name = conf.LOCK_KEY if lane == DEFAULT_LANE else f"{conf.LOCK_KEY}:{lane}"
    using = conf.LOCK_DATABASE_ALIAS
    if conf.PARTITIONS == 1:
        return AdvisoryLock(name, using=using)
    partitions, first = conf.PARTITIONS, rng.randrange(conf.PARTITIONS)
    return PartitionLock(name, partitions=partitions, using=using, first=first)


class PartitionLock(AdvisoryLock):
    """The partitions a worker owns, their advisory locks and its presence, on one direct session.

    Used like :class:`AdvisoryLock` by the worker: :meth:`acquire`
    begins a tick with a fair share (True when it owns a partition), :meth:`still_held` proves them held,
    :meth:`release` ends the tick (the partitions stay owned), :meth:`close` gives them and the presence
    back.
    """

    def __init__(
        self,
        name: str,
        *,
        partitions: int,
        using: str = "default",
        idle_session_timeout: int = LOCK_IDLE_SESSION_TIMEOUT_SECONDS,
        first: int = 0,
    ) -> None:
        super().__init__(name, using=using, idle_session_timeout=idle_session_timeout)
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.partitions = partitions
        self.names = lock_names(name, partitions)
        #: The partition this worker tries first (then the next ones): workers starting together
        #: spread over the partitions instead of all trying partition 0.
        self.first = first % partitions
        self._keys: list[int] = []
        self._presence_key = 0
        self._present = False
        #: The partitions this worker owns now (sorted); the claim takes only their rows.
        self.owned: tuple[int, ...] = ()
        #: Live workers of the lane (presence holders) and this worker's fair share, as last seen.
        self.live_workers = 1
        self.share = partitions
        #: The last acquisition took fewer partitions than the fair share (others held them).
        self.short = False
        #: The tick should end: this worker holds more than its share, or less while a partition is free.
        self.rebalance_due = False

    def _prove_direct(self, conn: psycopg.Connection[Any]) -> tuple[int, int]:
        pid, key = super()._prove_direct(conn)
        rows = conn.execute(_KEYS, ([*self.names, presence_name(self.name)],)).fetchall()
        keys = [int(row[0]) for row in rows]
        self._keys, self._presence_key = keys[:-1], keys[-1]
        return pid, key

    def _discard(self) -> None:
        super()._discard()
        self._present = False
        self.owned = ()

    def _look(self, conn: psycopg.Connection[Any]) -> tuple[dict[int, list[tuple[int, str]]], int]:
        """Who holds which of the lane's keys now, and the session's pid (LockNotDirect if not ours)."""
        rows = conn.execute(_SNAPSHOT, ([*self._keys, self._presence_key],)).fetchall()
        pid = int(rows[0][0])
        self._same_session(pid, "the partitions' locks were looked at")
        holders: dict[int, list[tuple[int, str]]] = {}
        for _, key, holder, mode in rows:
            if key is not None:
                holders.setdefault(int(key), []).append((int(holder), str(mode)))
        return holders, pid

    def _judge(self, holders: dict[int, list[tuple[int, str]]]) -> list[int]:
        """Count the live workers and the fair share; the partitions nobody holds."""
        self.live_workers = max(1, len(holders.get(self._presence_key, [])))
        self.share = fair_share(self.partitions, self.live_workers)
        return [p for p, key in enumerate(self._keys) if key not in holders]

    def acquire(self) -> bool:
        """A tick begins: keep the partitions owned (up to the fair share, giving back the rest) and take
        free ones up to the share. True when the worker owns at least one."""
        self.rebalance_due = False
        try:
            conn = self._connect()
            if not self._present:
                row = conn.execute("SELECT pg_try_advisory_lock_shared(%s)", (self._presence_key,)).fetchone()
                self._present = bool(row and row[0])
            holders, pid = self._look(conn)
            free = self._judge(holders)
            mine = [p for p in self.owned if (pid, "ExclusiveLock") in holders.get(self._keys[p], [])]
            keep, extra = mine[: self.share], mine[self.share :]
            if extra:
                self._unlock(conn, extra)
            taken: list[int] = []
            for p in self._order(free):
                if len(keep) + len(taken) >= self.share:
                    break
                row = conn.execute(
                    "SELECT pg_try_advisory_lock(%s), pg_backend_pid()", (self._keys[p],)
                ).fetchone()
                assert row is not None
                if int(row[1]) != pid:
                    self._abandon()
                    raise LockNotDirect(
                        self.using, f"partition {p}'s lock was tried in server process {row[1]}, not {pid}"
                    )
                if row[0]:
                    taken.append(p)
        except psycopg.Error as exc:
            self.last_error = exc
            self._discard()
            return False
        self.last_error = None
        self.owned = tuple(sorted(keep + taken))
        self.short = len(self.owned) < self.share
        self.held = bool(self.owned)
        return self.held

    def _order(self, free: Sequence[int]) -> list[int]:
        """The free partitions in the order to try them: from :attr:`first` on, wrapping around."""
        return sorted(free, key=lambda p: (p - self.first) % self.partitions)

    def still_held(self) -> bool:
        """Whether every owned partition is still this session's; also decides :attr:`rebalance_due`."""
        if not self.held or self._conn is None or self._conn.closed:
            return False
        try:
            holders, pid = self._look(self._conn)
        except psycopg.Error:
            self._discard()
            return False
        mine = {key for key, owners in holders.items() if (pid, "ExclusiveLock") in owners}
        if any(self._keys[p] not in mine for p in self.owned):
            self.held = False
            return False
        self._decide(self._judge(holders))
        return True

    def look(self) -> bool:
        """Between ticks: whether the next tick should start now to take or give back partitions."""
        if self._conn is None or self._conn.closed:
            return True  # the next tick reconnects and takes its share
        holders, _ = self._look(self._conn)
        self._decide(self._judge(holders))
        return self.rebalance_due

    def _decide(self, free: Sequence[int]) -> None:
        count = len(self.owned)
        self.rebalance_due = count > self.share or (count < self.share and bool(free))

    def release(self) -> None:
        """A tick ends: its partitions stay owned, so a worker keeps its rows from one tick to the next
        (and a partition is free only when its owner died or gave it back); :meth:`close` frees them."""
        self.held = False

    def close(self) -> None:
        """Give back every partition and the presence: the lock session ends."""
        self.held = False
        self._discard()

    def _unlock(self, conn: psycopg.Connection[Any], partitions: Sequence[int]) -> None:
        conn.execute(
            "SELECT pg_advisory_unlock(k) FROM unnest(%s::bigint[]) AS k",
            ([self._keys[p] for p in partitions],),
        )


# --------------------------------------------------------------------------------------------------
# Whether this worker still owns the cycle, known before each new provider call.
#
# The cycle's lock lives on a session of its own (:class:`AdvisoryLock`, above); PostgreSQL
# ends that session once it idles past ``LOCK_IDLE_SESSION_TIMEOUT_SECONDS``, and a standby then takes the
# lock and, once their leases run out, the rows. A process that was frozen (SIGSTOP, a paused VM) past that
# timeout must start nothing when it resumes. So a send may start only within :attr:`Ownership.window`
# seconds of the last time the lock was seen held: shorter than the idle timeout, a freeze long enough to
# lose the lock always outlasts it, and the worker's thread confirms the lock again (or learns it is lost)
# before any more calls start.
# --------------------------------------------------------------------------------------------------

#: The longest a confirmation lets calls start (the window is also at most half the idle timeout).
WINDOW_SECONDS = 5.0


class Ownership:
    """When the lock was last seen held, and whether a send may start now."""

    def __init__(self, monotonic: Callable[[], float], idle_session_timeout: float) -> None:
        self.monotonic = monotonic
        self.window = min(WINDOW_SECONDS, float(idle_session_timeout) / 2)
        self._confirmed_at: float | None = None
        self.lost = False

    def begin(self, at: float) -> None:
        """A tick took the lock at ``at``: owned, confirmed then."""
        self._confirmed_at, self.lost = at, False

    def confirm(self, held: bool, at: float) -> None:
        """What the lock's session said at ``at``; once lost, the tick never owns the cycle again."""
        if held and not self.lost:
            self._confirmed_at = at
        else:
            self.lost = True

    def may_send(self, at: float | None = None) -> bool:
        """Whether a new provider call may start now: the lock was seen held within the window."""
        if self.lost or self._confirmed_at is None:
            return False
        at = self.monotonic() if at is None else at
        return at - self._confirmed_at < self.window
