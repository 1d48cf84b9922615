"""engine.failures: which database errors a tick reports (and as what), and the loop's back-off."""

from __future__ import annotations

import psycopg
import pytest
from django.db import InterfaceError, OperationalError, ProgrammingError

from notifications_retry.engine import failures


def wrapped(django_error: type[Exception], driver_error: Exception) -> Exception:
    """What Django raises: its own class, with the driver's error as the cause."""
    try:
        try:
            raise driver_error
        except psycopg.Error as exc:
            raise django_error(str(exc)) from exc
    except django_error as outer:
        return outer


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            wrapped(OperationalError, psycopg.OperationalError("connection failed: refused")),
            failures.UNREACHABLE,
        ),
        (psycopg.OperationalError("connection failed: refused"), failures.UNREACHABLE),
        (InterfaceError("connection already closed"), failures.UNREACHABLE),
        (wrapped(OperationalError, psycopg.errors.AdminShutdown("terminating")), failures.UNREACHABLE),
        (wrapped(ProgrammingError, psycopg.errors.UndefinedTable("no relation")), failures.NOT_MIGRATED),
        (wrapped(ProgrammingError, psycopg.errors.UndefinedColumn("no column")), failures.NOT_MIGRATED),
        (wrapped(OperationalError, psycopg.errors.QueryCanceled("timeout")), failures.DATABASE_ERROR),
        (wrapped(OperationalError, psycopg.errors.DiskFull("full")), failures.DATABASE_ERROR),
    ],
)
def test_database_failures_are_classified(error, kind):
    failure = failures.classify(error)
    assert failure is not None and failure.kind == kind
    assert "\n" not in failure.message and failure.message.startswith("database ")
    assert failure.exit_status == (4 if kind == failures.NOT_MIGRATED else 3)
    assert ("run manage.py migrate" in failure.message) == (kind == failures.NOT_MIGRATED)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("not a database error"),
        wrapped(ProgrammingError, psycopg.errors.SyntaxError("syntax error at or near")),
        psycopg.errors.UniqueViolation("duplicate key"),
    ],
)
def test_bugs_are_not_reported_as_database_failures(error):
    assert failures.classify(error) is None


def test_the_message_is_the_first_line_of_the_drivers_error_without_credentials():
    error = psycopg.OperationalError("connection failed: refused\n\tIs the server running on that host?")
    message = failures.classify(error).message
    assert message.endswith("is unreachable: connection failed: refused")
    assert "PASSWORD" not in message and "postgres://" not in message


def test_backoff_doubles_from_one_second_up_to_the_cap_and_resets_after_a_good_tick():
    backoff = failures.Backoff(interval=0.1)
    assert backoff.pause(failed=False) == 0.1
    assert [backoff.pause(failed=True) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.pause(failed=False) == 0.1
    assert backoff.pause(failed=True) == 1


def test_a_failed_tick_is_followed_by_the_backoff_not_the_interval() -> None:
    """A tick cut by a dropped connection on the default interval (60 s) is retried a second later."""
    backoff = failures.Backoff(interval=60.0)
    assert [backoff.pause(failed=True) for _ in range(3)] == [1, 2, 4]
    assert backoff.pause(failed=False) == 60.0
