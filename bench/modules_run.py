"""How many of the package's modules a one-record ``retry_worker --once`` runs, and which.

A fresh interpreter (so nothing is imported yet) installs a profiler on every thread before Django
starts, runs ``manage.py retry_worker --once`` on the benchmark database with one due row of a webhook
channel pointed at the benchmark's receiver (``bench.sink``), and lists every module of the package
whose code ran: its body on import, or any of its functions. Django's own start-up of the app is
included, as a deployment pays it. The figure is a measure of the house a record walks through: fewer
modules is less to read and, on the hot path, less to run.

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
import json, os, sys, threading
import notifications_retry
package = os.path.dirname(notifications_retry.__file__)
ran = set()
imported = set()

def profile(frame, event, arg):
    if event == "call":
        path = frame.f_code.co_filename
        if path.startswith(package):
            # A module's body runs on import; its functions and methods run when they are called.
            (imported if frame.f_code.co_name == "<module>" else ran).add(os.path.relpath(path, package))

threading.setprofile(profile)
sys.setprofile(profile)
import django
django.setup()
from django.core.management import call_command
call_command("retry_worker", "--once", "--no-housekeeping")
sys.setprofile(None)
threading.setprofile(None)
keep = lambda names: sorted(m for m in names if "/migrations/" not in m)
print("MODULES " + json.dumps({"called": keep(ran), "imported": keep(imported | ran)}))
"""


def modules_run() -> dict[str, list[str]]:
    """The package modules a one-record ``--once`` tick imports, and those whose functions it calls."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "NR_BENCH_DATABASE_NAME": bench_dbname()}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES "))
    return dict(json.loads(line[len("MODULES ") :]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="print every module that ran")
    args = parser.parse_args(argv)
    os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_modules_bench")
    recreate_database()
    setup_django()
    sink = Sink(0.0)
    try:
        reset_rows()
        add_rows([webhook_channel(sink, max_concurrency=4)], 1)
        ran = modules_run()
        if sink.count() != 1:
            raise RuntimeError(f"the tick sent {sink.count()} requests, not 1")
    finally:
        sink.stop()
    called, imported = ran["called"], ran["imported"]
    print(f"package modules a one-record retry_worker --once (webhook) imports: {len(imported)}")
    print(f"  of which a function or method ran: {len(called)}")
    by_package: dict[str, int] = {}
    for module in called:
        top = module.split("/")[0] if "/" in module else "(package root)"
        by_package[top] = by_package.get(top, 0) + 1
    for top, count in sorted(by_package.items(), key=lambda item: -item[1]):
        print(f"    {top:<18} {count}")
    if args.list:
        print("\n".join(f"  {m}" for m in called))


if __name__ == "__main__":
    main()
