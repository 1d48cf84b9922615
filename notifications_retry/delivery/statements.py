"""A transaction's statements as data, run by either driver: Django's cursor or an asynchronous psycopg one.

A step function is a generator: it yields a :class:`Statement`, receives its rows (or, for a
statement that returns none, its row count), and returns what the transaction produced. The SQL and
the Python between the statements are written once; :func:`run_steps` runs them on the worker's
Django connection, :func:`run_steps_async` on an ``AsyncConnection`` the send loop awaits (the claim
of asynchronous channels, engine.claim_connection), so the loop goes on with the calls in flight
while the server works.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Mapping
from typing import Any, TypeVar

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class Statement:
    """One statement: its SQL, its parameters, and whether its rows are read."""

    sql: str
    params: Mapping[str, Any]
    rows: bool = True


#: What a step function yields and receives: rows (a list of tuples) or a row count.
Steps = Generator[Statement, Any, _T]


def run_steps(steps: Steps[_T], cursor: Any) -> _T:
    """Run ``steps`` on a synchronous DB-API cursor (Django's); the caller holds the transaction."""
    answer: Any = None
    while True:
        try:
            statement = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        cursor.execute(statement.sql, statement.params)
        answer = cursor.fetchall() if statement.rows else cursor.rowcount


async def run_steps_async(steps: Steps[_T], cursor: Any) -> _T:
    """Run ``steps`` on an asynchronous psycopg cursor; the caller holds the transaction."""
    answer: Any = None
    while True:
        try:
            statement = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await cursor.execute(statement.sql, statement.params)
        answer = await cursor.fetchall() if statement.rows else cursor.rowcount


__all__ = ["Statement", "Steps", "run_steps", "run_steps_async"]
