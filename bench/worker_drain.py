"""The worker's drain, driven only through its management command (``retry_worker --once``).

The engine behind the command may change; its options and the rows it leaves are the contract the
benchmark measures.
"""

from __future__ import annotations

from bench.db import count_sent


def drain_once(expected: int) -> int:
    """One ``retry_worker --once`` tick big enough for ``expected`` due rows; returns rows it sent.

    Django's connection is closed before and after, so the tick opens its own and the commit
    counters of its session are reported when it ends.
    """
    from django.core.management import call_command
    from django.db import connections

    before = count_sent()
    connections.close_all()
    call_command(
        "retry_worker",
        "--once",
        "--batch-size",
        str(expected + 1000),
        "--max-duration",
        "3600",
    )
    connections.close_all()
    return count_sent() - before
