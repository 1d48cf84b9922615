"""A no-op drain as a user runs it: ``manage.py retry_worker --once`` in a process of its own, with the
example project's settings (its logging, its connection options), on the ``stub`` provider.

The in-process drains of :mod:`bench.ceiling` leave out what a user's command pays: the interpreter and
Django starting, the example project's log pipeline (for a worker, structlog writing its lines itself to
stderr, here a pipe) and the process's exit. Here the command's wall time, from the spawn to the exit,
is set against the lean raw-SQL drain (:mod:`bench.lean`) on the same server, interleaved over the
rounds, so drift on a shared machine hits both alike. The same command on an empty backlog gives what
the process costs before and after its tick.

The app's and the example project's modules are compiled to bytecode first, as pip compiles an installed
package: an editable install has none, and with ``PYTHONDONTWRITEBYTECODE`` set (as in many container
images) Python would compile them again at every start, a cost a deployed worker does not pay.
"""

from __future__ import annotations

import compileall
import dataclasses
import os
import statistics
import subprocess
import sys
import time
from urllib.parse import urlsplit, urlunsplit

from bench import lean
from bench.costs import Cost, measure
from bench.db import ROOT, add_rows, bench_dbname, channel, count_sent, reset_rows
from bench.report import COST_HEADER, cost_row, median_cost, table

COMMAND_LABEL = "manage.py retry_worker --once (example settings, stub)"
#: The engine issue's target for the command's share of the lean drain's rows/s.
TARGET = 0.30


def _database_url() -> str:
    """DATABASE_URL pointed at the benchmark database, as the example project reads it."""
    url = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    return urlunsplit(url._replace(path="/" + bench_dbname()))


def run_command(batch_size: int) -> float:
    """Run the command once (logs to a pipe the benchmark reads and drops); its wall seconds."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": _database_url(),
        "NR_BATCH_SIZE": str(batch_size),
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "manage.py", "retry_worker", "--once", "--max-duration", "3600"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=3600,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"retry_worker --once exited {done.returncode}: {done.stdout[-2000:]!r}")
    return seconds


def _command(rows: int, cid: int) -> Cost:
    reset_rows()
    add_rows([cid], rows)

    def drain() -> int:
        before = count_sent()
        run_command(rows + 1000)
        return count_sent() - before

    cost = measure(COMMAND_LABEL, drain)
    if cost.rows != rows:
        raise RuntimeError(f"the command sent {cost.rows} of {rows} rows")
    return dataclasses.replace(cost, client_cpu_s=None)  # the command's CPU is another process's


def _lean(rows: int) -> Cost:
    lean.create(rows)
    return measure("lean, inline", lean.drain_inline)


def compile_bytecode() -> None:
    """Compile the app and the example project to bytecode (``__pycache__``), as ``pip install`` does."""
    for package in ("notifications_retry", "example_project"):
        if not compileall.compile_dir(os.path.join(ROOT, package), quiet=1):
            raise RuntimeError(f"compiling {package} to bytecode failed")


def report(rows: int, rounds: int) -> tuple[str, float]:
    """Measure and describe; returns the text and the command's share of the lean drain's rows/s."""
    compile_bytecode()
    stub = channel("stub", "stub")
    runs: dict[str, list[Cost]] = {}
    empty: list[float] = []
    for _ in range(rounds):
        for cost in (_lean(rows), _command(rows, stub)):
            runs.setdefault(cost.label, []).append(cost)
        reset_rows()
        empty.append(run_command(1000))
    lean_cost = median_cost(runs["lean, inline"])
    command = median_cost(runs[COMMAND_LABEL])
    share = command.rows_per_s / lean_cost.rows_per_s
    wal = command.wal_per_row / lean_cost.wal_per_row
    rates = {label: [c.rows_per_s for c in costs] for label, costs in runs.items()}
    startup = statistics.median(empty)
    lines = [
        f"## No-op drain as a user runs it: {rows:,} due rows, median of {rounds} rounds",
        table(
            ["ratio", "measured", "target"],
            [
                ["command / lean, rows/s", f"{share:.2f}", f">= {TARGET:.2f}"],
                ["command / lean, WAL per notification", f"{wal:.2f}x", ""],
            ],
        ),
        "",
        table(COST_HEADER, [cost_row(c, rates.get(c.label, ())) for c in (lean_cost, command)]),
        f"The same command on an empty backlog (start, lock, an empty tick, exit): {startup:.2f} s, "
        f"{startup / command.seconds:.0%} of the drain's {command.seconds:.2f} s.",
    ]
    return "\n".join(lines), share
