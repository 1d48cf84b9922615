"""The cycle's single-owner lock: a PostgreSQL session advisory lock on a dedicated connection.

A session lock dies with its connection, so a killed owner frees it at once; the connection's
``idle_session_timeout`` and TCP keepalives bound how long a hung owner can keep it. Session
locks do not survive PgBouncer transaction pooling: point ``LOCK_DATABASE_ALIAS`` past the pooler.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
from django.db import connections


def dedicated_connection(using: str, application_name: str) -> psycopg.Connection[Any]:
    """An autocommit connection of its own to database ``using``, with TCP keepalives.

    Session advisory locks live on it: a fresh wrapper gives Django's connection parameters without
    sharing Django's connection, and keepalives let the server notice a vanished owner.
    """
    params = connections.create_connection(using).get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.update(
        autocommit=True,
        application_name=application_name,
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
    )
    return psycopg.connect(**params)


class AdvisoryLock:
    """``pg_try_advisory_lock(hashtextextended(name, 0))`` held on a connection of its own."""

    def __init__(self, name: str, *, using: str = "default", idle_session_timeout: int = 90) -> None:
        self.name = name
        self.using = using
        self.idle_session_timeout = idle_session_timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._key: int | None = None
        self.held = False
        #: Why the last ``acquire`` could not ask PostgreSQL (None: it asked, whatever the answer).
        self.last_error: psycopg.Error | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        conn = dedicated_connection(self.using, "notifications_retry lock")
        conn.execute(f"SET idle_session_timeout = '{int(self.idle_session_timeout)}s'")
        row = conn.execute("SELECT hashtextextended(%s, 0)", (self.name,)).fetchone()
        assert row is not None
        self._key = int(row[0])
        self._conn = conn
        return conn

    @property
    def key(self) -> int:
        """The bigint advisory-lock key of ``name`` (computed by PostgreSQL)."""
        self._connect()
        assert self._key is not None
        return self._key

    def acquire(self) -> bool:
        """Try to take the lock without waiting; True when this process owns the cycle.

        False also when the database could not be asked: ``last_error`` then says why, so the
        caller can report the failure instead of "held by another instance".
        """
        self.last_error = None
        try:
            conn = self._connect()
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
        except psycopg.Error as exc:
            self.last_error = exc
            self._discard()
            return False
        self.held = bool(row and row[0])
        return self.held

    def still_held(self) -> bool:
        """Whether the lock is still ours: the connection is alive and PostgreSQL lists the lock."""
        if not self.held or self._conn is None or self._conn.closed:
            return False
        try:
            row = self._conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
                "AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = %s",
                (self._key,),
            ).fetchone()
        except psycopg.Error:
            self._discard()
            return False
        self.held = bool(row and row[0])
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

    def _discard(self) -> None:
        self.held = False
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
        self._conn = None
