"""A transaction's statements run on an asynchronous connection in as few messages as their answers
allow (delivery.session.run_transaction_async): all or nothing, on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

from notifications_retry.delivery.session import CopyIn, Statement, Steps, run_steps, run_transaction_async

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def table():
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE nr_test_tx (id int PRIMARY KEY, note text)")
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE nr_test_tx")


def rows() -> list[tuple[int, str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, note FROM nr_test_tx ORDER BY id")
        return list(cursor.fetchall())


def run(steps: Steps[Any], **kwargs: Any) -> Any:
    async def go() -> Any:
        conn = await psycopg.AsyncConnection.connect(
            **{
                **connection.get_connection_params(),
                "cursor_factory": psycopg.AsyncClientCursor,
                "autocommit": True,
            }
        )
        try:
            result = await run_transaction_async(conn, steps, **kwargs)
            return result, conn.info.transaction_status
        except BaseException as exc:
            return exc, conn.info.transaction_status
        finally:
            await conn.close()

    return asyncio.run(go())


def test_statements_whose_rows_are_not_read_are_written_with_the_next_read_and_the_commit(table):
    seen: list[Any] = []

    def steps() -> Steps[str]:
        # Each statement has its own parameters, under the same name: they are rendered one by one.
        answer = yield Statement(
            "INSERT INTO nr_test_tx VALUES (%(id)s, %(note)s)", {"id": 1, "note": "a'b"}, rows=False
        )
        seen.append(answer)
        found = yield Statement("SELECT note FROM nr_test_tx WHERE id = %(id)s", {"id": 1})
        seen.append(found)
        yield Statement(
            "INSERT INTO nr_test_tx VALUES (%(id)s, %(note)s)", {"id": 2, "note": "100%"}, rows=False
        )
        return "done"

    result, status = run(steps())
    assert result == "done" and status == psycopg.pq.TransactionStatus.IDLE
    assert seen == [None, [("a'b",)]], "a held statement answers None; a read sees what was held before it"
    assert rows() == [(1, "a'b"), (2, "100%")]


def test_a_failing_held_statement_undoes_the_whole_transaction(table):
    def steps() -> Steps[None]:
        yield Statement("INSERT INTO nr_test_tx VALUES (%(id)s, 'x')", {"id": 1}, rows=False)
        yield Statement("INSERT INTO nr_test_tx VALUES (%(id)s, 'y')", {"id": 1}, rows=False)  # duplicate key
        return None

    result, status = run(steps())
    assert isinstance(result, psycopg.errors.UniqueViolation)
    assert status == psycopg.pq.TransactionStatus.IDLE, "rolled back: the connection can be used again"
    assert rows() == []


def test_an_exception_of_the_steps_rolls_back_what_was_sent(table):
    class Refused(Exception):
        pass

    def steps() -> Steps[None]:
        yield Statement("INSERT INTO nr_test_tx VALUES (1, 'x')", {}, rows=False)
        yield Statement("SELECT count(*) FROM nr_test_tx", {})
        raise Refused("the steps refuse after a read")

    result, status = run(steps())
    assert isinstance(result, Refused) and status == psycopg.pq.TransactionStatus.IDLE
    assert rows() == []


def test_before_commit_runs_once_every_read_is_done_and_before_the_held_writes(table):
    during: list[list[tuple[int, str]]] = []

    def steps() -> Steps[None]:
        yield Statement("INSERT INTO nr_test_tx VALUES (1, 'read before')", {}, rows=False)
        yield Statement("SELECT 1", {})
        yield Statement("INSERT INTO nr_test_tx VALUES (2, 'held')", {}, rows=False)
        return None

    def look() -> None:  # another session, as the monolith (Django's ORM refuses to run in the loop)
        params = {k: v for k, v in connection.get_connection_params().items() if k != "cursor_factory"}
        with psycopg.connect(**params) as other:
            during.append(list(other.execute("SELECT id, note FROM nr_test_tx ORDER BY id").fetchall()))

    result, _ = run(steps(), before_commit=look)
    assert result is None
    assert during == [[]], "nothing is visible to another session before the COMMIT"
    assert rows() == [(1, "read before"), (2, "held")]


def copying(note: str) -> Statement:
    """An INSERT of (1, note) whose COPY writes (2, note) instead: which one ran shows in the table."""
    return Statement(
        "INSERT INTO nr_test_tx VALUES (1, %(note)s)",
        {"note": note},
        rows=False,
        copy=CopyIn("COPY nr_test_tx (id, note) FROM STDIN", lambda: [(2, note)]),
    )


def test_django_s_cursor_runs_a_statement_s_copy_and_the_loop_s_connection_its_insert(table):
    def steps() -> Steps[None]:
        yield copying("tab\there, a back\\slash")
        return None

    with transaction.atomic(), connection.cursor() as cursor:
        run_steps(steps(), cursor)
    assert rows() == [(2, "tab\there, a back\\slash")]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM nr_test_tx")
    result, _ = run(steps())
    assert result is None
    assert rows() == [(1, "tab\there, a back\\slash")]


def test_a_refused_copy_raises_django_s_database_error(table):
    # finalize tells a refused row from an outage by Django's exceptions: a COPY raises the same ones.
    def steps() -> Steps[None]:
        yield copying("first")
        yield copying("again")  # the same key
        return None

    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        run_steps(steps(), cursor)
    assert rows() == []


def test_a_cursor_without_psycopg_s_copy_runs_the_insert(table):
    class Wrapped:  # a DB-API cursor behind a wrapper of its own, with no psycopg cursor to copy on
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def execute(self, sql: str, params: Any) -> None:
            self.inner.execute(sql, params)

        def fetchall(self) -> Any:
            return self.inner.fetchall()

    def steps() -> Steps[None]:
        yield copying("inserted")
        return None

    with transaction.atomic(), connection.cursor() as cursor:
        run_steps(steps(), Wrapped(cursor))
    assert rows() == [(1, "inserted")]
