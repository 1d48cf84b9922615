"""An asynchronous psycopg connection the worker's send loop keeps: the claims' and the commits' own.

It is opened with the options of Django's connection to the same alias (TCP keepalives, no prepared
statements, so a PgBouncer in transaction mode serves it as it serves Django) at its first use, and
kept from tick to tick: a connect costs tens of milliseconds, the lateness of a row that wakes the
worker. A kept connection the server closed meanwhile (a restart, an idle session's timeout) fails on
its first statement: the work is tried once more, on a new one (``loop-connection-replaced``, so an
operator sees the cut). Any other failure closes it and is raised: the caller redoes the work on
Django's connection, whose fallbacks tell a refused row from an outage.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import structlog
from django.db import DEFAULT_DB_ALIAS, connections

from notifications_retry.asyncio_bridge import SteppedLoop
from notifications_retry.exception_chain import first_line

_T = TypeVar("_T")

log = structlog.get_logger("notifications_retry.worker")

Work = Callable[["psycopg.AsyncConnection[Any]"], Awaitable[_T]]


class LoopConnection:
    """An ``AsyncConnection`` used by tasks of ``loop`` only (its owner's thread): no lock."""

    #: What the connection is for, in its log events: ``claims`` or ``commits``.
    role = "claims"

    def __init__(self, loop: SteppedLoop, *, alias: str = DEFAULT_DB_ALIAS, role: str | None = None) -> None:
        self.loop = loop
        self.alias = alias
        if role is not None:
            self.role = role
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def open(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def run(self, work: Work[_T]) -> _T:
        """``work(connection)``'s result; raises psycopg's errors (the connection closed first)."""
        retry = self.open
        while True:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(**self._params())
            try:
                return await work(self._conn)
            except psycopg.Error as exc:
                await self.aclose()  # the next use starts on a new connection
                if not retry or not isinstance(exc, psycopg.OperationalError):
                    raise
                retry = False
                log.warning("loop-connection-replaced", connection=self.role, error=first_line(exc))

    def _params(self) -> dict[str, Any]:
        # Settings only (Django opens no connection here): safe to read with the loop running.
        params = dict(connections[self.alias].get_connection_params())
        # Django's cursor class is a synchronous one; the client-side binding is the same.
        params["cursor_factory"] = psycopg.AsyncClientCursor
        params["autocommit"] = True  # each use is one explicit transaction
        return params

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            await conn.close()

    def close(self) -> None:
        """Close the connection (the worker closes), running the loop for it."""
        if self._conn is not None:
            self.loop.run(self.aclose())


__all__ = ["LoopConnection"]
