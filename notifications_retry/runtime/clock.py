"""The one clock that due and lease decisions use.

By default it is the database's: the process reads PostgreSQL's time once per tick and keeps
the offset, so a skewed application clock changes nothing. Tests inject a :class:`ManualClock`.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from django.db import connections


class Clock(Protocol):
    """Anything that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime: ...

    def sync(self) -> None:
        """Re-read the reference time (called at the start of every tick)."""


class SystemClock:
    """The process's own clock; for deployments that trust NTP on every host."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sync(self) -> None:
        pass


class DatabaseClock:
    """PostgreSQL's clock, read once per tick and advanced with the process's monotonic clock."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self._base: datetime | None = None
        self._mono = 0.0

    def sync(self) -> None:
        with connections[self.using].cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (db_now,) = cursor.fetchone()
        self._base, self._mono = db_now.astimezone(UTC), time.monotonic()

    def now(self) -> datetime:
        if self._base is None:
            self.sync()
        assert self._base is not None
        return self._base + timedelta(seconds=time.monotonic() - self._mono)


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def sync(self) -> None:
        pass

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when


def default_clock(name: str, using: str = "default") -> Clock:
    """The clock named by the ``CLOCK`` setting."""
    return DatabaseClock(using) if name == "database" else SystemClock()
