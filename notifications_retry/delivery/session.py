"""Bounds on the worker's own transactions, set per transaction so that nothing leaks onto a pooled session.

A worker process that freezes (SIGSTOP, a debugger, a VM paused) while one of its transactions is
open would hold that transaction's row locks for as long as it is frozen: the monolith's own updates
of those rows would wait. ``idle_in_transaction_session_timeout`` makes the server end such a
transaction (and its session) after :data:`TRANSACTION_TIMEOUT_SECONDS`; ``statement_timeout`` bounds a
statement stuck behind a lock the same way. ``SET LOCAL`` (``set_config(..., true)``) keeps both to the
transaction itself: a connection pool or PgBouncer hands the session on with its own settings.
"""

from __future__ import annotations

import contextlib
from typing import Any, TypeVar

from django.db import DatabaseError, connection, connections

from notifications_retry.database.tcp_settings import TCP_SETTINGS
from notifications_retry.delivery.statements import Statement, Steps


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


_T = TypeVar("_T")


def bounded(steps: Steps[_T]) -> Steps[_T]:
    """``steps`` (delivery.statements) after the statement that bounds their transaction."""
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
