"""The asynchronous psycopg connection the worker's send loop keeps: its claims' and its commits'.

It is opened with the options of Django's connection to the same alias (TCP keepalives, no prepared
statements, so a PgBouncer in transaction mode serves it as it serves Django) at its first use, and
kept from tick to tick: a connect costs tens of milliseconds, the lateness of a row that wakes the
worker. A kept connection the server closed meanwhile (a restart, an idle session's timeout) fails on
its first statement: the work is tried once more, on a new one (``loop-connection-replaced``, so an
operator sees the cut). Any other failure closes it and is raised: the caller redoes the work on
Django's connection, whose fallbacks tell a refused row from an outage.

The claims and the commits share it, so a worker holds three connections while it drains, its lock's
and Django's included. They are tasks of one loop on one thread: each use (a transaction) runs whole
before the next one starts, in the order they asked (:meth:`LoopConnection.run`), so a commit never
runs inside a claim's transaction; a commit waits for a claim under way at most (a few milliseconds),
and the calls in flight go on meanwhile.

A connect must never be left half done while the loop stands still: a server that is shutting down
(or starting) waits for the half-open session's startup message up to its ``authentication_timeout``
before it can exit, and the worker's own connects to it time out meanwhile. So work that runs in the
background of the loop (the commits) never connects: :meth:`connect` opens the connection from the
loop's owner, running the loop until it is done, and ``run(..., connect=False)`` raises
:class:`NotConnected` when there is none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import structlog
from django.db import DEFAULT_DB_ALIAS, connections

from notifications_retry.exceptions import first_line
from notifications_retry.runtime.asyncio_bridge import SteppedLoop

_T = TypeVar("_T")

log = structlog.get_logger("notifications_retry.worker")

Work = Callable[["psycopg.AsyncConnection[Any]"], Awaitable[_T]]


async def _opened(conn: psycopg.AsyncConnection[Any]) -> None:
    """No work: :meth:`LoopConnection.run` opened the connection for it."""


class NotConnected(Exception):
    """Background work found no open connection (the owner opens it: :meth:`LoopConnection.connect`)."""


class LoopConnection:
    """An ``AsyncConnection`` used by tasks of ``loop`` only (its owner's thread), one use at a time."""

    #: What the connection is for, in its log events.
    role = "claims"

    def __init__(self, loop: SteppedLoop, *, alias: str = DEFAULT_DB_ALIAS, role: str | None = None) -> None:
        self.loop = loop
        self.alias = alias
        if role is not None:
            self.role = role
        self._conn: psycopg.AsyncConnection[Any] | None = None
        #: One use at a time: the tasks of the one loop queue here, in order (made on the loop).
        self._turns: asyncio.Lock | None = None
        self._turns_loop: asyncio.AbstractEventLoop | None = None

    @property
    def open(self) -> bool:
        return self._conn is not None and not self._conn.closed

    async def run(self, work: Work[_T], *, connect: bool = True) -> _T:
        """``work(connection)``'s result, once the uses asked before it have ended; raises psycopg's
        errors (the connection closed first).

        ``connect=False``: only on a connection already open, never tried again on a new one
        (:class:`NotConnected` when there is none).
        """
        loop = asyncio.get_running_loop()
        if self._turns is None or self._turns_loop is not loop:  # a loop closed and made again
            self._turns, self._turns_loop = asyncio.Lock(), loop
        async with self._turns:  # a transaction at a time: the claims' and the commits' take turns
            return await self._run(work, connect)

    async def _run(self, work: Work[_T], connect: bool) -> _T:
        retry = self.open and connect
        while True:
            if self._conn is None or self._conn.closed:
                if not connect:
                    raise NotConnected(f"no {self.role} connection open")
                await self._connect()
            assert self._conn is not None
            try:
                return await work(self._conn)
            except psycopg.Error as exc:
                await self.aclose()  # the next use starts on a new connection
                if not retry or not isinstance(exc, psycopg.OperationalError):
                    raise
                retry = False
                log.warning("loop-connection-replaced", connection=self.role, error=first_line(exc))

    def connect(self) -> None:
        """Open the connection if it is not, running the loop until it is (raises psycopg's errors)."""
        if not self.open:
            self.loop.run(self.run(_opened))

    async def _connect(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(**self._params())

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


__all__ = ["LoopConnection", "NotConnected"]
