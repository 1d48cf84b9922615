"""``python -m bench.against --rev REV`` (``make engine-cpu-bench``): the engine's CPU a row against an older
commit, measured in one run.

Checks ``REV`` out into a temporary ``git worktree`` and alternates drains between this tree and that one,
each drain in a subprocess whose working directory and ``PYTHONPATH`` are its tree (it imports that tree's
``notifications_retry`` and ``bench``): the engine alone (``bench.engine_alone.sleep_drain``, a provider that
waits 20 ms on the send loop) and, with ``--webhook``, the webhook drain against one 20 ms receiver
(``bench.receiver.http_drain``) beside the bare aiohttp client's CPU a request against that receiver. Both
trees drain the same rows at the same ``max_concurrency`` on the same server of ``DATABASE_URL``, each in a
database of its own (``nr_bench_against_current``, ``nr_bench_against_old``; their migrations differ),
with the log pipeline ``retry_worker`` processes are advised to use (``bench.settings``, ``native``), after a
warm-up drain in the same process (a running worker's rows, not a fresh process's imports).
Prints the CPU a row of each tree in each round, the medians and their ratio (this tree ÷ ``REV``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from bench.db import ROOT

#: What a child runs in its tree: ``setup`` migrates its database; ``engine`` and ``webhook`` drain.
_CHILD = """
import json, sys
from bench.db import recreate_database, setup_django
part, rows, conc, url = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if part == "setup":
    recreate_database()
    print(json.dumps({}))
    raise SystemExit(0)
setup_django()
from bench.settings import configure_logging
configure_logging("native")
# A warm-up drain first: the measured one then costs what a running worker's rows cost, not the
# imports and first calls of a fresh process.
warm = min(rows, 10 * conc)
if part == "engine":
    from bench.engine_alone import sleep_drain
    sleep_drain(warm, max_concurrency=conc)
    result = sleep_drain(rows, max_concurrency=conc)
    print(json.dumps({"cpu_us_per_row": result["cpu_us_per_row"], "rows_per_s": result["rows_per_s"]}))
else:
    from bench.receiver import Sink, http_drain
    class _Fixed(Sink):
        def __init__(self, url):
            self.url = url
            self.port = int(url.split(":")[2].split("/")[0])
    http_drain(_Fixed(url), warm, max_concurrency=conc, rate=None)
    result = http_drain(_Fixed(url), rows, max_concurrency=conc, rate=None)
    print(json.dumps({"cpu_us_per_row": 1000 * result["cpu_ms_per_row"], "rows_per_s": result["rows_per_s"]}))
"""


def _child(tree: str, database: str, part: str, rows: int, conc: int, url: str = "-") -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=tree, NR_BENCH_DATABASE_NAME=database)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, part, str(rows), str(conc), url],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{part} drain in {tree} failed:\n{done.stderr[-4000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _client_alone(url: str, requests: int, conc: int) -> float:
    """The bare aiohttp client's CPU µs a request against the receiver at ``url``."""
    import asyncio

    from bench.http_clients import aiohttp_client, drive

    return float(asyncio.run(drive(aiohttp_client, url, requests, conc))["cpu_us"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.against", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--rev", default="dd66c22", help="The commit to compare with (default dd66c22).")
    parser.add_argument("--concurrency", type=int, default=128, help="The channel's max_concurrency.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds; medians reported.")
    parser.add_argument(
        "--rows", type=int, default=None, help="Rows a drain (default: 100 per unit of max_concurrency)."
    )
    parser.add_argument(
        "--webhook",
        action="store_true",
        help="Also drain a webhook channel (20 ms receiver) in each tree, and the bare aiohttp client.",
    )
    return parser


def _line(name: str, values: list[float]) -> str:
    rounds = ", ".join(f"{v:.0f}" for v in values)
    return f"{name}: median {statistics.median(values):.0f} µs/row (rounds: {rounds})"


def main(argv: list[str] | None = None) -> int:
    """Run the alternating drains and print the CPU a row of each tree and their ratio."""
    args = _parser().parse_args(argv)
    rows = args.rows or 100 * args.concurrency
    rev = subprocess.run(
        ["git", "rev-parse", "--short", args.rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"engine CPU a row: this tree against {rev}, {rows:,} rows a drain, max_concurrency "
        f"{args.concurrency}, {args.rounds} rounds, {os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="nr-against-") as tmp:
        old = os.path.join(tmp, "tree")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", old, rev], cwd=ROOT, check=True)
        try:
            return _compare(args, rows, rev, {"current": ROOT, "old": old})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", old], cwd=ROOT, check=False)


def _compare(args: argparse.Namespace, rows: int, rev: str, trees: dict[str, str]) -> int:
    databases = {name: f"nr_bench_against_{name}" for name in trees}
    for name, tree in trees.items():
        _child(tree, databases[name], "setup", 0, 0)
    parts = ["engine", "webhook"] if args.webhook else ["engine"]
    results: dict[tuple[str, str], list[float]] = {(p, n): [] for p in parts for n in trees}
    client: list[float] = []
    sink: Any = None
    if args.webhook:
        from bench.receiver import Sink

        sink = Sink(0.02)
    try:
        for round_ in range(args.rounds):
            # Alternate which tree goes first, so neither always drains on a warmer machine.
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for part in parts:
                if part == "webhook":
                    client.append(_client_alone(sink.url, rows, args.concurrency))
                for name in order:
                    url = sink.url if part == "webhook" else "-"
                    got = _child(trees[name], databases[name], part, rows, args.concurrency, url)
                    results[(part, name)].append(got["cpu_us_per_row"])
            print(
                f"round {round_ + 1}: "
                + "; ".join(f"{p} {n} {results[(p, n)][-1]:.0f} µs/row" for p in parts for n in trees)
                + (f"; aiohttp alone {client[-1]:.0f} µs/request" if client else "")
            )
    finally:
        if sink is not None:
            sink.stop()
    for part in parts:
        current, old = results[(part, "current")], results[(part, "old")]
        label = "engine alone" if part == "engine" else "webhook drain"
        print(_line(f"{label}, this tree", current))
        print(_line(f"{label}, {rev}", old))
        ratio = statistics.median(current) / statistics.median(old)
        print(f"{label}: this tree ÷ {rev} = {ratio:.2f}")
    if client:
        print(_line("aiohttp alone", client).replace("µs/row", "µs/request"))
        for name, label in (("current", "this tree"), ("old", rev)):
            ratio = statistics.median(results[("webhook", name)]) / statistics.median(client)
            print(f"webhook drain, {label} ÷ aiohttp alone = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
