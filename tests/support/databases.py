"""Throwaway databases on the test server, and a loopback port where nothing listens."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from django.conf import settings

#: Set it to give every database the suite creates a prefix of your own (a shared server, several
#: checkouts at once): ``NR_TEST_DATABASE_PREFIX=ci42_ make test``.
PREFIX_ENV = "NR_TEST_DATABASE_PREFIX"


def database_name(name: str) -> str:
    """``name`` with this run's database prefix (:data:`PREFIX_ENV`), if any."""
    return os.environ.get(PREFIX_ENV, "") + name


@dataclass(frozen=True)
class ScratchDatabase:
    name: str
    url: str
    host: str
    port: str
    user: str
    password: str


def _admin_params() -> dict[str, Any]:
    base = settings.DATABASES["default"]
    params = {
        "host": base["HOST"] or None,
        "port": base["PORT"] or None,
        "user": base["USER"] or None,
        "password": base["PASSWORD"] or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    return {k: v for k, v in params.items() if v is not None}


@contextlib.contextmanager
def scratch_database(prefix: str = "nr_scratch") -> Iterator[ScratchDatabase]:
    """An empty database (no tables at all), dropped afterwards even if a process still uses it."""
    base = settings.DATABASES["default"]
    name = database_name(f"{prefix}_{uuid.uuid4().hex[:10]}")
    with psycopg.connect(**_admin_params()) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    host, port = base["HOST"] or "127.0.0.1", str(base["PORT"] or 5432)
    user, password = base["USER"] or "postgres", base["PASSWORD"] or ""
    auth = f"{user}:{password}" if password else user
    try:
        yield ScratchDatabase(name, f"postgres://{auth}@{host}:{port}/{name}", host, port, user, password)
    finally:
        with psycopg.connect(**_admin_params()) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then released): connecting is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
