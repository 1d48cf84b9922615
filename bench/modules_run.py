"""How many of the package's modules a one-record ``retry_worker --once`` runs, and which.

A fresh interpreter (so nothing is imported yet) installs a profiler on every thread before Django
starts, runs ``manage.py retry_worker --once`` on the benchmark database with one due row of a webhook
channel pointed at the benchmark's receiver (``bench.sink``), and sorts the package's modules:

- *ran*: a function or method of the module ran, in Django's start-up of the app (``ready()``, the
  checks) or in the command. This is the house a record walks through, and the figure reported;
- *imported only*: its body ran on import (module and class bodies: definitions), nothing else.

It reports the tick as a deployment runs it (the worker relays the outbox events its commits wrote)
and, with ``--no-relay``, the delivery path alone. Housekeeping is left out of both (its own schedule).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.modules_run [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench.db import ROOT, add_rows, bench_dbname, recreate_database, reset_rows, setup_django
from bench.receiver import Sink, webhook_channel

#: Runs in the fresh interpreter: profile, start Django, run one tick, print the modules that ran.
PROBE = r"""
import inspect, json, os, sys, threading
import notifications_retry
package = os.path.dirname(notifications_retry.__file__)
phase = ["start-up"]
ran = {"start-up": set(), "command": set()}
bodies = set()

def profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        if code.co_filename.startswith(package):
            module = os.path.relpath(code.co_filename, package)
            # Functions and methods are optimized code; module and class bodies (run once, on import) are not.
            if code.co_flags & inspect.CO_OPTIMIZED:
                ran[phase[0]].add(module)
            else:
                bodies.add(module)

threading.setprofile(profile)
sys.setprofile(profile)
import django
django.setup()
from django.core.management import call_command
phase[0] = "command"
call_command("retry_worker", "--once", "--no-housekeeping", *sys.argv[1:])
sys.setprofile(None)
threading.setprofile(None)
keep = lambda names: sorted(m for m in names if "/migrations/" not in m)
every = ran["start-up"] | ran["command"]
print("MODULES " + json.dumps({
    "ran": keep(every), "command": keep(ran["command"]), "imported": keep(bodies | every),
}))
"""


def modules_run(*options: str) -> dict[str, list[str]]:
    """The package modules a one-record ``--once`` tick imports, and those whose functions run."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "NR_BENCH_DATABASE_NAME": bench_dbname()}
    command = [sys.executable, "-c", PROBE, *options]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES "))
    return dict(json.loads(line[len("MODULES ") :]))


def one_tick(sink: Sink, *options: str) -> dict[str, list[str]]:
    """One due webhook row, one ``--once`` tick with ``options``; the modules it ran."""
    reset_rows()
    add_rows([webhook_channel(sink, max_concurrency=4)], 1)
    before = sink.count()
    ran = modules_run(*options)
    if sink.count() != before + 1:
        raise RuntimeError(f"the tick sent {sink.count() - before} requests, not 1")
    return ran


def by_folder(modules: list[str]) -> str:
    counts: dict[str, int] = {}
    for module in modules:
        top = module.split("/")[0] if "/" in module else "(root)"
        counts[top] = counts.get(top, 0) + 1
    return ", ".join(f"{top} {n}" for top, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="print every module that ran")
    parser.add_argument("--server", choices=["url"], default="url", help="the server of DATABASE_URL")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_modules_bench")
    recreate_database()
    setup_django()
    sink = Sink(0.0)
    try:
        ticks = {"--once": one_tick(sink), "--once --no-relay": one_tick(sink, "--no-relay")}
    finally:
        sink.stop()
    for name, ran in ticks.items():
        print(f"one-record retry_worker {name} (webhook): package modules that ran {len(ran['ran'])}")
        print(f"  in the command (start-up left out): {len(ran['command'])}")
        print(f"  imported (bodies ran, nothing else): {len(ran['imported'])}")
        print(f"  by folder: {by_folder(ran['ran'])}")
        if args.list:
            print("\n".join(f"    {m}" for m in ran["ran"]))


if __name__ == "__main__":
    main()
