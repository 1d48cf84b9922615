"""The cycle's single-owner lock: a PostgreSQL session advisory lock on a dedicated, direct connection.

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
from collections.abc import Mapping
from typing import Any

import psycopg
from django.db import connections

from notifications_retry.database.tcp_settings import TCP_SETTINGS

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
        if pid != self._pid:
            self._abandon()
            raise LockNotDirect(
                self.using,
                f"the lock was tried in server process {pid}, not in the session proven at connect time "
                f"(pid {self._pid})",
            )
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
