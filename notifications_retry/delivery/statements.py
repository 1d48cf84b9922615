"""A transaction's statements as data, run by either driver: Django's cursor or an asynchronous psycopg one.

A step function is a generator: it yields a :class:`Statement`, receives its rows (None for a
statement whose rows are not read), and returns what the transaction produced. The SQL and the Python
between the statements are written once; :func:`run_steps` runs them on the worker's Django
connection, :func:`run_transaction_async` as a transaction of their own on an ``AsyncConnection`` the
send loop awaits (the worker's claims and commits, engine.loop_connection), so the loop goes on with
the calls in flight while the server works.

There a round trip is dear: each one waits for a turn of a loop busy with the calls' answers. So the
statements travel in as few messages as their answers allow: the ``BEGIN``, and every statement whose
rows are not read, go with the next statement whose rows are, and the last of them with the
``COMMIT``. A commit (``BEGIN``, the bound, the outcomes; their events, the health window;
``COMMIT``) is three messages where it was seven statements each waiting for its own answer.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import orjson
import psycopg

_T = TypeVar("_T")


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


__all__ = ["CopyIn", "Statement", "Steps", "run_steps", "run_transaction_async"]
