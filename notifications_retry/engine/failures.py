"""What a tick that failed on the database reports, and how long the loop waits before the next one.

A tick that cannot reach the database, or finds its tables missing, must say so in one line an
operator can act on (not a driver traceback, and never "lock held by another instance"), and a loop
must not retry at full speed while the database is down. ``retry_worker --once`` turns the kind of
failure into its exit status (docs/operations.md lists them).
"""

from __future__ import annotations

import dataclasses

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from notifications_retry.exceptions import causes, message_line
from notifications_retry.rules.backoff import exponential_delay

#: The database could not be reached, or dropped the connection.
UNREACHABLE = "database-unreachable"
#: The app's tables or columns are missing: ``manage.py migrate`` has not run (or not to the end).
NOT_MIGRATED = "database-not-migrated"
#: Any other error the server answered with (a cancelled statement, a full disk...).
DATABASE_ERROR = "database-error"

#: Exit statuses of ``retry_worker --once`` by kind (0: the tick ran, or another instance held the lock).
EXIT_STATUS = {UNREACHABLE: 3, DATABASE_ERROR: 3, NOT_MIGRATED: 4}

#: What a tick skipped for the lock reports as its reason.
LOCK_HELD = "lock held by another instance"

# SQLSTATEs of a schema that is behind the code: undefined table, column, function, schema.
_NOT_MIGRATED_STATES = frozenset({"42P01", "42703", "42883", "3F000"})
# Class 08 is "connection exception"; 57P01-57P03 a server shutting down or starting up.
_UNREACHABLE_STATES = frozenset({"57P01", "57P02", "57P03"})

# What a dropped or refused connection raises, from Django's wrappers or from psycopg directly.
_CONNECTION_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)

#: First pause after a failed tick, doubled for each further failure up to the cap (seconds).
BACKOFF_FIRST_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class TickFailure:
    """A database failure in one line: its kind and a message naming what failed and what to do."""

    kind: str
    message: str

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.kind]


def _where(alias: str) -> str:
    """``database NAME on HOST:PORT`` of a DATABASES alias, without credentials."""
    try:
        settings = connections.settings[alias]
    except Exception:
        return f"database {alias!r}"
    host = settings.get("HOST") or "local socket"
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"database {settings.get('NAME')!r} on {host}{port}"


def classify(exc: BaseException, alias: str = "default") -> TickFailure | None:
    """The failure ``exc`` stands for, or None when it is no such failure (a bug: let it raise)."""
    if not isinstance(exc, DatabaseError | InterfaceError | psycopg.Error):
        return None
    # Django's wrappers keep the driver's error as the cause.
    chain = list(causes(exc))
    states = {state for e in chain if (state := getattr(e, "sqlstate", None))}
    detail = message_line(next((e for e in chain if isinstance(e, psycopg.Error)), exc))
    if states & _NOT_MIGRATED_STATES:
        return TickFailure(NOT_MIGRATED, f"{_where(alias)} is not migrated ({detail}): run manage.py migrate")
    lost = isinstance(exc, _CONNECTION_ERRORS)
    # No SQLSTATE at all: the server never answered (a refused or dropped connection).
    if lost and all(state[:2] == "08" or state in _UNREACHABLE_STATES for state in states):
        return TickFailure(UNREACHABLE, f"{_where(alias)} is unreachable: {detail}")
    if isinstance(exc, OperationalError | psycopg.OperationalError):
        return TickFailure(DATABASE_ERROR, f"{_where(alias)} failed the tick: {detail}")
    return None


class Backoff:
    """The time from one tick's start to the next: the interval, or after failed ticks a backoff.

    Consecutive failures double the pause from ``BACKOFF_FIRST_SECONDS`` up to ``BACKOFF_CAP_SECONDS``,
    so a loop whose database is down logs a line every few seconds at most, and is back within the cap
    once the database is. The backoff is not stretched to the interval: the interval is only the
    longest time between two ticks, and a tick cut by a dropped connection (a failover, a pooler's idle
    cut) is followed by the next one a second later, not a whole interval later.
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.failures = 0

    def pause(self, failed: bool) -> float:
        """Seconds between the start of the tick that just ended and the next one's."""
        if not failed:
            self.failures = 0
            return self.interval
        self.failures += 1
        return exponential_delay(self.failures, BACKOFF_FIRST_SECONDS, BACKOFF_CAP_SECONDS)


__all__ = [
    "BACKOFF_CAP_SECONDS",
    "BACKOFF_FIRST_SECONDS",
    "DATABASE_ERROR",
    "EXIT_STATUS",
    "LOCK_HELD",
    "NOT_MIGRATED",
    "UNREACHABLE",
    "Backoff",
    "TickFailure",
    "classify",
]
