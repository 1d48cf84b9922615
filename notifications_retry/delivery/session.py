"""The worker's transactions: their bounds, their statements written once for either driver, and the
connection the send loop runs them on (:class:`LoopConnection`).

Bounds on the worker's own transactions are set per transaction so that nothing leaks onto a pooled
session.
A worker process that freezes (SIGSTOP, a debugger, a VM paused) while one of its transactions is
open would hold that transaction's row locks for as long as it is frozen: the monolith's own updates
of those rows would wait. ``idle_in_transaction_session_timeout`` makes the server end such a
transaction (and its session) after :data:`TRANSACTION_TIMEOUT_SECONDS`; ``statement_timeout`` bounds a
statement stuck behind a lock the same way. ``SET LOCAL`` (``set_config(..., true)``) keeps both to the
transaction itself: a connection pool or PgBouncer hands the session on with its own settings.

A transaction's statements are data, run by either driver: Django's cursor or an asynchronous psycopg
one.
A step function is a generator: it yields a :class:`Statement`, receives its rows (None for a
statement whose rows are not read), and returns what the transaction produced. The SQL and the Python
between the statements are written once; :func:`run_steps` runs them on the worker's Django
connection, :func:`run_transaction_async` as a transaction of their own on an ``AsyncConnection`` the
send loop awaits (the worker's claims and commits, on its :class:`LoopConnection`), so the loop goes
on with the calls in flight while the server works.

There a round trip is dear: each one waits for a turn of a loop busy with the calls' answers. So the
statements travel in as few messages as their answers allow: the ``BEGIN``, and every statement whose
rows are not read, go with the next statement whose rows are, and the last of them with the
``COMMIT``. A commit (``BEGIN``, the bound, the outcomes; their events, the health window;
``COMMIT``) is three messages where it was seven statements each waiting for its own answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import psycopg
import structlog
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections

from notifications_retry.database.tcp_settings import TCP_SETTINGS
from notifications_retry.exceptions import first_line

if TYPE_CHECKING:
    from notifications_retry.runtime.asyncio_bridge import SteppedLoop

_T = TypeVar("_T")

log = structlog.get_logger("notifications_retry.worker")


@dataclasses.dataclass(frozen=True, slots=True)
class CopyIn:
    """The rows an ``INSERT`` writes, as a ``COPY … FROM STDIN`` of the same rows (``sql``: the COPY;
    ``rows``: called when the COPY runs, one tuple per row in the COPY's column order)."""

    sql: str
    rows: Callable[[], Iterable[Sequence[Any]]]


@dataclasses.dataclass(frozen=True, slots=True)
class Statement:
    """One statement: its SQL, its parameters, and whether its rows are read.

    ``copy``: the same rows as a COPY, which :func:`run_steps` runs instead of the ``INSERT``. COPY
    writes a page's new rows in one WAL record (PostgreSQL's multi-insert), where an ``INSERT`` writes
    a record per row, with its own header, block reference and tuple header. On the send loop's
    connection the ``INSERT`` travels in the message of the statements around it (its rows are not
    read), which a COPY's own exchange cannot: :func:`run_transaction_async` runs the ``INSERT``
    unless told to copy.
    """

    sql: str
    params: Mapping[str, Any]
    rows: bool = True
    copy: CopyIn | None = None


#: What a step function yields and receives: rows (a list of tuples), or None when they are not read.
Steps = Generator[Statement, Any, _T]


def json_document(value: Any) -> str:
    """``value`` as the JSON text of a statement's parameter (rows travel as one document, read by
    ``jsonb_to_recordset``). orjson writes it: the standard library's encoder took about 9 µs a row for
    a commit's two documents, most of the Python a commit costs. What orjson refuses (a lone surrogate
    in a provider's error text, an integer past 64 bits) is written by the standard library's encoder
    as before, and the database judges it: a row it refuses fails alone (delivery.finalize)."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return json.dumps(value)


def run_steps(steps: Steps[_T], cursor: Any) -> _T:
    """Run ``steps`` on Django's cursor (a statement's ``copy`` through its psycopg cursor); the caller
    holds the transaction."""
    answer: Any = None
    while True:
        try:
            statement = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if statement.copy is not None and hasattr(getattr(cursor, "cursor", None), "copy"):
            _copy_in(cursor, statement.copy)
            answer = None
            continue
        cursor.execute(statement.sql, statement.params)
        answer = cursor.fetchall() if statement.rows else None


def _copy_in(cursor: Any, copy: CopyIn) -> None:
    """``copy`` on Django's cursor: through its psycopg cursor, with Django's error wrapping, so that
    a refused row raises the ``DatabaseError`` an ``INSERT``'s would. (A cursor without psycopg's
    ``copy``, behind a wrapper of its own, runs the statement's ``INSERT`` instead.)"""
    with cursor.db.wrap_database_errors, cursor.cursor.copy(copy.sql) as writer:
        for row in copy.rows():
            writer.write_row(row)


async def run_transaction_async(
    conn: Any, steps: Steps[_T], *, before_commit: Callable[[], None] | None = None, copy: bool = False
) -> _T:
    """Run ``steps`` as one transaction on ``conn``, an asynchronous psycopg connection in autocommit
    mode whose cursors bind parameters on the client (``AsyncClientCursor``: each statement is
    rendered with its own parameters, and several go in one message). ``before_commit`` is called
    once every statement whose rows are read has run, before the rest and the ``COMMIT`` are sent.
    ``copy``: a statement's ``copy`` runs as a COPY of its own, after the statements held before it
    (one round trip more, for a page's rows in one WAL record: a claim that settles inline rows writes
    hundreds of events at once); otherwise its ``INSERT`` travels with the statements around it.

    Raises what the statements (or ``steps``) raised, the transaction rolled back; a connection left
    inside a transaction it cannot end (cancelled mid-way) is closed, so its next use cannot inherit it.
    """
    held: list[str] = ["BEGIN"]
    answer: Any = None
    try:
        async with conn.cursor() as cursor:
            while True:
                try:
                    statement = steps.send(answer)
                except StopIteration as done:
                    if before_commit is not None:
                        before_commit()
                    await cursor.execute("; ".join([*held, "COMMIT"]))
                    return done.value  # type: ignore[no-any-return]
                answer = None
                if copy and statement.copy is not None:
                    if held:
                        await cursor.execute("; ".join(held))
                        held = []
                    async with cursor.copy(statement.copy.sql) as writer:
                        for row in statement.copy.rows():
                            await writer.write_row(row)
                    continue
                held.append(cursor.mogrify(statement.sql, statement.params))
                if statement.rows:
                    await cursor.execute("; ".join(held))
                    held = []
                    while cursor.nextset():  # the answer is the last statement's
                        pass
                    answer = await cursor.fetchall()
    except BaseException:
        await _end(conn)
        raise


async def _end(conn: Any) -> None:
    """After a failure: roll back what is open, or close a connection that cannot be rolled back."""
    if conn.closed or conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        await conn.rollback()
    except BaseException:
        await conn.close()
        raise


__all__ = [
    "CopyIn",
    "LoopConnection",
    "NotConnected",
    "Statement",
    "Steps",
    "run_steps",
    "run_transaction_async",
]


def bound_connections(*aliases: str) -> None:
    """Give this process's connections to ``aliases`` :data:`TCP_SETTINGS`, from their next statement.

    A key the alias's ``OPTIONS`` set already keeps its value: the project's choice wins (a
    ``connect_timeout`` of its own still gets the keepalives and the user timeout). For processes the
    worker owns (``retry_worker``, ``outbox_relay``); the settings change for the whole process.
    """
    for alias in aliases:
        options = connections.settings[alias].setdefault("OPTIONS", {})
        missing = {key: value for key, value in TCP_SETTINGS.items() if key not in options}
        if not missing:
            continue
        options.update(missing)
        # A connection opened before (the command's system checks query the channels) would go on
        # without them: this thread's is closed, so its next statement connects with them.
        wrapper = connections[alias]
        if wrapper.connection is not None and not wrapper.in_atomic_block:
            wrapper.close()


#: The longest one of the worker's own transactions (claim, commit of outcomes, release, the heartbeat's
#: update) may stay idle or run one statement. Its statements take milliseconds: 30 s is far past any
#: of them on a loaded server, and short enough that a frozen worker's row locks never hold the
#: monolith's updates of those rows for long.
TRANSACTION_TIMEOUT_SECONDS = 30.0

# JIT off too: these transactions run short statements, and a recursive query's rough estimates (the
# claim's walk over tenants) could pass jit_above_cost and spend 100 ms compiling a 2 ms statement.
BOUND_SQL = (
    "SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true), "
    "set_config('statement_timeout', %(ms)s, true), set_config('jit', 'off', true)"
)


def bound_transaction(cursor: Any) -> None:
    """Let the server end the current transaction if it idles or a statement runs past the bound."""
    cursor.execute(BOUND_SQL, bound_params())


def bound_params() -> dict[str, str]:
    """The parameters of :data:`BOUND_SQL`: the bound, :data:`TRANSACTION_TIMEOUT_SECONDS`."""
    return {"ms": f"{int(TRANSACTION_TIMEOUT_SECONDS * 1000)}ms"}


def bounded(steps: Steps[_T]) -> Steps[_T]:
    """``steps`` after the statement that bounds their transaction."""
    yield Statement(BOUND_SQL, bound_params(), rows=False)
    return (yield from steps)


def drop_broken_connection() -> None:
    """Reconnect after a lost connection (server restart, terminated backend) instead of failing forever.

    Unlike ``close_old_connections`` this keeps a healthy connection, whatever ``CONN_MAX_AGE`` says:
    a long-running worker has no request cycle to bound a connection's life. The connection is this
    thread's own (the worker's, the relay's); the next statement opens a new one.
    """
    if connection.connection is not None and not connection.in_atomic_block and not connection.is_usable():
        # Closing a connection the server already dropped may raise too: it is gone either way.
        with contextlib.suppress(DatabaseError):
            connection.close()


# --------------------------------------------------------------------------------------------------
# The asynchronous psycopg connection the worker's send loop keeps: its claims' and its commits'.
#
# It is opened with the options of Django's connection to the same alias (TCP keepalives, no prepared
# statements, so a PgBouncer in transaction mode serves it as it serves Django) at its first use, and
# kept from tick to tick: a connect costs tens of milliseconds, the lateness of a row that wakes the
# worker. A kept connection the server closed meanwhile (a restart, an idle session's timeout) fails on
# its first statement: the work is tried once more, on a new one (``loop-connection-replaced``, so an
# operator sees the cut). Any other failure closes it and is raised: the caller redoes the work on
# Django's connection, whose fallbacks tell a refused row from an outage.
#
# The claims and the commits share it, so a worker holds three connections while it drains, its lock's
# and Django's included. They are tasks of one loop on one thread: each use (a transaction) runs whole
# before the next one starts, in the order they asked (:meth:`LoopConnection.run`), so a commit never
# runs inside a claim's transaction; a commit waits for a claim under way at most (a few milliseconds),
# and the calls in flight go on meanwhile.
#
# A connect must never be left half done while the loop stands still: a server that is shutting down
# (or starting) waits for the half-open session's startup message up to its ``authentication_timeout``
# before it can exit, and the worker's own connects to it time out meanwhile. So work that runs in the
# background of the loop (the commits) never connects: :meth:`LoopConnection.connect` opens the connection
# from the loop's owner, running the loop until it is done, and ``run(..., connect=False)`` raises
# :class:`NotConnected` when there is none.
# --------------------------------------------------------------------------------------------------

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
