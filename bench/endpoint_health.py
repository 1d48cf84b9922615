"""``python -m bench.endpoint_health`` (``make health-bench``): how soon a failing endpoint's calls stop.

Two figures, each with the real worker (``Worker.tick``) against a real HTTP receiver on 127.0.0.1 (in
this process, on its own threads) and PostgreSQL (database ``nr_bench_health`` of ``DATABASE_URL``'s
server unless NR_BENCH_DATABASE_NAME is set):

* **calls to a 410 endpoint**: a webhook channel at ``max_concurrency`` 8 with ``--rows`` (500) due rows
  and a batch of as many; the receiver answers ``410 Gone`` after ``--delay`` seconds. One tick in real
  time, committing as a running worker does (the send loop's own connection). Printed per trial: the
  calls the receiver got, rows dead-lettered, rows given back untouched, the channel's state, the
  channel-health events.
* **time to disable a 97 %-failing endpoint on default settings** (``CIRCUIT_BREAKER`` failure_threshold
  5, cooldown_seconds 30; ``ENDPOINT_HEALTH`` min_attempts 50, disable_ratio 0.95): ticks on a
  simulated clock (the wall clock and the monotonic one move together between ticks), each tick at the
  moment a looping worker would start it: when its interval ends or the channel's circuit may let a
  probe through, whichever comes first. The calls themselves are real. The receiver fails 97 calls in
  100: evenly (the 34th, 67th and 100th of each hundred succeed), then with ``--seeds`` random orders.
  Printed: the simulated time from the first call to the disable, and the calls it took.

Exit status 1 when a figure misses its bound (more than ``max_concurrency`` calls to the 410 endpoint, or
the evenly failing endpoint not disabled within 10 minutes).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

os.environ.setdefault("NR_BENCH_DATABASE_NAME", "nr_bench_health")

# The database name is chosen above, before bench.db reads it.
from bench.db import TABLE, add_rows, channel, connect, recreate_database, reset_rows

CONCURRENCY = 8
#: The bound on the simulated time to disable the evenly failing endpoint.
DISABLE_BOUND_SECONDS = 600.0
#: Ticks stop there: an endpoint not disabled by then is reported as such.
SIMULATED_LIMIT_SECONDS = 3600.0


class Receiver:
    """An HTTP receiver on 127.0.0.1: ``answer(n)`` (the n-th request, from 1) gives the status."""

    def __init__(self, answer: Callable[[int], int], delay: float = 0.0) -> None:
        self.answer, self.delay = answer, delay
        self.count = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.count += 1
                    status = receiver.answer(receiver.count)
                if receiver.delay:
                    time.sleep(receiver.delay)
                body = b'{"id": "m"}' if status < 300 else b"no"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiving(answer: Callable[[int], int], delay: float = 0.0) -> Iterator[Receiver]:
    receiver = Receiver(answer, delay)
    try:
        yield receiver
    finally:
        receiver.close()


def _rows_by_state(cid: int) -> tuple[int, int]:
    """(dead-lettered rows, rows untouched: attempt count and log as seeded) of channel ``cid``."""
    with connect() as conn:
        row = conn.execute(
            f"""SELECT count(*) FILTER (WHERE dead_lettered_at IS NOT NULL),
                       count(*) FILTER (WHERE attempts = 1 AND attempt_log = '[]'::jsonb
                                        AND claim_token IS NULL AND status = 'failed')
                FROM {TABLE} WHERE channel_id = %s""",
            (cid,),
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


def _health(cid: int) -> tuple[bool, str, int]:
    """The channel's is_enabled, health_state, and its channel-health events."""
    from notifications_retry.models import CHANNEL_HEALTH_TOPIC, ChannelConfig, Outbox

    config = ChannelConfig.objects.get(pk=cid)
    events = Outbox.objects.filter(topic=CHANNEL_HEALTH_TOPIC, key=config.key).count()
    return config.is_enabled, config.health_state, events


def gone_trial(trial: int, rows: int, delay: float) -> int:
    """One tick against an endpoint answering 410 Gone; returns the calls it got."""
    from django.db import connections

    from notifications_retry.engine.worker import Worker

    reset_rows()
    with receiving(lambda n: 410, delay) as receiver:
        cid = channel(
            f"gone_{trial}",
            "webhook",
            options={"url": receiver.url},
            max_concurrency=CONCURRENCY,
        )
        add_rows([cid], rows)
        connections.close_all()
        worker = Worker(batch_size=rows, rng=random.Random(trial))
        try:
            stats = worker.tick()
        finally:
            worker.close()
        calls = receiver.count
    dead, untouched = _rows_by_state(cid)
    enabled, state, events = _health(cid)
    print(
        f"  trial {trial + 1}: {calls} calls, {stats.claims} rows claimed, {dead} dead-lettered, "
        f"{untouched} given back untouched; channel {state} (is_enabled {enabled}), "
        f"{events} channel-health event(s)"
    )
    return calls


class SimulatedTime:
    """The worker's clocks on simulated time: real time passes inside a tick; between ticks, a jump."""

    def __init__(self) -> None:
        from notifications_retry.runtime.clock import ManualClock

        self.clock = ManualClock()
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds
        self.clock.advance(seconds)


@dataclass
class Disabled:
    seconds: float | None  # None: not disabled within SIMULATED_LIMIT_SECONDS
    calls: int
    ticks: int
    reason: str


def failing_trial(name: str, answer: Callable[[int], int], rows: int) -> Disabled:
    """Ticks as a looping worker would run them until the channel is disabled (or the limit)."""
    from django.db import connections

    from notifications_retry.engine.worker import Worker
    from notifications_retry.models import ChannelConfig, ChannelHealthChange

    reset_rows()
    sim = SimulatedTime()
    with receiving(answer) as receiver:
        # The channel's own defaults (max_concurrency 10, 5 attempts, backoff from 60 s).
        cid = channel(f"failing_{name}", "webhook", options={"url": receiver.url})
        add_rows([cid], rows)
        # The seeded rows fell due an hour before the real now: the simulated wall clock starts there.
        from django.utils import timezone

        sim.clock.set(timezone.now())
        connections.close_all()
        worker = Worker(clock=sim.clock, monotonic=sim.monotonic, rng=random.Random(1))
        started_wall = sim.clock.now()
        ticks = 0
        try:
            while True:
                began = sim.monotonic()
                worker.tick()
                ticks += 1
                if not ChannelConfig.objects.filter(pk=cid, is_enabled=True).exists():
                    break
                if (sim.clock.now() - started_wall).total_seconds() > SIMULATED_LIMIT_SECONDS:
                    break
                # A looping worker's next tick: when its interval ends, or when a channel's pause or
                # open circuit ends (engine.wakeup.reopens_at); the rows falling due meanwhile wake it
                # too, but an open circuit lets no call through before then.
                now = sim.monotonic()
                reopen = [b for rt in worker.channels.runtimes.values() if (b := rt.blocked_until()) > now]
                wake = min([began + worker.interval, *reopen])
                sim.jump(max(0.001, wake - sim.monotonic()))
        finally:
            worker.close()
        calls = receiver.count
    change = ChannelHealthChange.objects.filter(channel_id=cid, state="disabled").first()
    if change is None:
        return Disabled(None, calls, ticks, "")
    return Disabled((change.created_at - started_wall).total_seconds(), calls, ticks, change.reason)


def evenly_97(n: int) -> int:
    """3 calls in 100 succeed, spread evenly (the 34th, 67th and 100th)."""
    return 200 if (3 * n) // 100 > (3 * (n - 1)) // 100 else 500


def random_97(seed: int) -> Callable[[int], int]:
    rng = random.Random(seed)
    return lambda n: 500 if rng.random() < 0.97 else 200


def _minutes(seconds: float | None) -> str:
    if seconds is None or seconds == math.inf:
        return f"not disabled within {SIMULATED_LIMIT_SECONDS / 60:.0f} min"
    return f"{seconds / 60:.1f} min"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=500, help="due rows (and the batch) of the 410 run")
    parser.add_argument("--delay", type=float, default=0.02, help="the 410 receiver's answer time (s)")
    parser.add_argument("--trials", type=int, default=5, help="410 runs")
    parser.add_argument("--seeds", type=int, default=20, help="random orders of the 97 %% failures")
    parser.add_argument("--failing-rows", type=int, default=300, help="due rows of the failing channel")
    parser.add_argument("--server", choices=["url"], default="url", help="the server of DATABASE_URL")
    args = parser.parse_args(argv)
    recreate_database()
    missed = False

    print(
        f"calls to a 410 endpoint, channel max_concurrency {CONCURRENCY}, {args.rows} rows claimable "
        f"in one tick (batch {args.rows}), answer after {args.delay * 1000:.0f} ms:"
    )
    calls = [gone_trial(trial, args.rows, args.delay) for trial in range(args.trials)]
    print(f"  most calls in {args.trials} trials: {max(calls)} (bound: {CONCURRENCY})")
    missed |= max(calls) > CONCURRENCY

    print("time for a 97 %-failing endpoint to be disabled on default settings (simulated clock):")
    even = failing_trial("even", evenly_97, args.failing_rows)
    print(
        f"  evenly (3 in 100 succeed): {_minutes(even.seconds)}, {even.calls} calls, {even.ticks} ticks; "
        f"reason: {even.reason}"
    )
    missed |= even.seconds is None or even.seconds > DISABLE_BOUND_SECONDS
    if args.seeds:
        found = [
            failing_trial(f"seed{seed}", random_97(seed), args.failing_rows) for seed in range(args.seeds)
        ]
        times = sorted(math.inf if d.seconds is None else d.seconds for d in found)
        within = sum(t <= DISABLE_BOUND_SECONDS for t in times)
        p90 = times[min(len(times) - 1, math.ceil(0.9 * len(times)) - 1)]
        print(
            f"  random order, {args.seeds} seeds: median {_minutes(statistics.median(times))}, "
            f"90th percentile {_minutes(p90)}, worst {_minutes(times[-1])}; {within} of {args.seeds} "
            f"within {DISABLE_BOUND_SECONDS / 60:.0f} min; calls: median "
            f"{statistics.median(d.calls for d in found):.0f}"
        )
        for seed, d in enumerate(found):
            print(f"    seed {seed}: {_minutes(d.seconds)}, {d.calls} calls")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
