"""Network faults between the worker and its servers: latency, loss and a partition during one drain.

The worker runs in a network namespace of its own; PostgreSQL (a throwaway cluster) and the webhook
receiver run in a second one; a veth pair joins them and carries every packet between them. During a drain
of a few thousand rows the link gets, one after the other: 5 % random loss, 200 ms of latency, then on top
of the latency a 20-second partition (every packet dropped, both ways, silently), and is healed.

Asserted: no row lost (every row Sent, one outbox event each, every key reached the receiver), the worker
sends again after the partition heals without being restarted, and no transaction of the worker that holds
locks, an xid or a snapshot stays idle on the server longer than its bound (``TRANSACTION_TIMEOUT``).
Printed: duplicate sends (by the fault in force when the repeat was sent), the time to resume after the
heal, rows/s under each fault, the longest idle transaction of any kind the server saw and its last
statement. ``make faults`` runs it (root, ``ip netns``; skipped otherwise).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from notifications_retry.delivery import session
from tests.faults.conftest import NOT_SENT, StartWorker, not_sent, seed_webhook_drain, stop_and_count
from tests.faults.sampler import ServerSampler
from tests.faults.servers import NamespacedCluster, Receiver, Request
from tests.support.netns import NetworkPair
from tests.support.processes import wait_until, worker_env

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

ROWS = int(os.environ.get("NR_FAULTS_ROWS", "3000"))
LATENCY_MS = 200
LOSS_PERCENT = 5.0
#: How long the latency and the loss each last; the partition lasts PARTITION_SECONDS.
FAULT_SECONDS = float(os.environ.get("NR_FAULTS_PHASE_SECONDS", "15"))
PARTITION_SECONDS = 20.0
#: The server ends a transaction of the worker left idle this long: the worker's bound on its own
#: transactions (``delivery.session.TRANSACTION_TIMEOUT_SECONDS``, 30 s shipped) set to half the
#: partition, so the transaction a partition strands must be ended by the server. A worker without the
#: bound fails it: its transaction outlives the partition.
TRANSACTION_TIMEOUT = 10.0
#: A sample every 0.2 s of a timer the server fires on time: one second of slack is ample.
SAMPLING_SLACK = 1.0
#: Ample: the worker must come back by itself; the figure printed is the measured one.
RESUME_LIMIT = 180.0
LEASED = "SELECT count(*) FROM notifications_retry_notificationentity WHERE claim_token IS NOT NULL"
#: A transaction of the worker that has written (it has an xid) and waits for the worker's next statement.
OPEN_WRITE = """
SELECT count(*) FROM pg_stat_activity
WHERE client_addr = %s::inet AND state = 'idle in transaction' AND backend_xid IS NOT NULL
"""
OPEN_WRITE_WAIT = 15.0


def test_drain_through_latency_loss_and_partition_loses_nothing(
    network: NetworkPair, cluster: NamespacedCluster, receiver: Receiver, start_worker: StartWorker
) -> None:
    seed_webhook_drain(cluster, receiver, ROWS)
    settings: dict[str, object] = {"WEBHOOK_ALLOWED_HOSTS": [network.servers.address]}
    bound = {f"{session.__name__}.TRANSACTION_TIMEOUT_SECONDS": TRANSACTION_TIMEOUT}
    env = worker_env(cluster.url, "postgres", settings, {"NR_TEST_CONSTANTS_JSON": json.dumps(bound)})
    worker = start_worker(env)
    sampler = ServerSampler(cluster.connect, network.worker.address).start()
    marks: dict[str, float] = {"clean": time.monotonic()}

    def enter(phase: str) -> None:
        """Mark the moment a fault is in force (its rules are in place), for the figures by phase."""
        marks[phase] = time.monotonic()
        sampler.phase = phase

    try:
        wait_until(lambda: receiver.count() >= 100, 120, 0.1, "the worker sends through the clean link")
        network.loss(LOSS_PERCENT)
        enter("loss")
        time.sleep(FAULT_SECONDS)
        # The partition falls while the latency is still in force: every statement's answer then takes
        # 200 ms, so a transaction stays open long enough to be caught, and stranded, by the partition.
        network.delay(LATENCY_MS)
        enter("latency")
        time.sleep(FAULT_SECONDS)
        stranding = _await_open_write(cluster, network.worker.address)
        network.partition()
        enter("partition")
        with cluster.connect() as db:
            left, leased = (
                (db.execute(NOT_SENT).fetchone() or (0,))[0],
                (db.execute(LEASED).fetchone() or (0,))[0],
            )
        assert left > 0, "the drain ended before the partition: raise NR_FAULTS_ROWS"
        time.sleep(PARTITION_SECONDS)
        network.clear()
        enter("healed")
        healed = marks["healed"]
        try:
            wait_until(
                lambda: any(r.at > healed for r in receiver.requests()),
                RESUME_LIMIT,
                0.1,
                "a send after the heal",
            )
        except AssertionError as exc:  # what the worker was doing: every thread's stack
            raise AssertionError(f"{exc}; the worker's log:\n{worker.abort_with_stacks()}") from None
        wait_until(lambda: not_sent(cluster) == 0, RESUME_LIMIT + 120, 0.5, "every row Sent")
        enter("drained")
    finally:
        sampler.stop()
        network.clear()
    end = stop_and_count(worker, receiver, cluster)
    requests, per_key, output, exit_status = end.requests, end.per_key, end.output, end.exit_status
    lost, events, event_keys = end.lost, end.events, end.event_keys
    figures = _figures(marks, sampler, requests, per_key, left, leased, cluster, output)
    figures["fault method"] = network.method
    figures["a writing transaction open just before the partition / stranded by it"] = (
        f"{stranding} / {sampler.longest('idle_holding', {'partition', 'healed'}) > 1.0}"
    )
    figures["TRANSACTION_TIMEOUT_SECONDS given to the worker"] = TRANSACTION_TIMEOUT
    figures["worker exit status"] = exit_status
    print("\nnetwork fault figures:\n" + "\n".join(f"  {name}: {value}" for name, value in figures.items()))

    assert lost == 0
    assert (events, event_keys) == (ROWS, ROWS)
    assert len(per_key) == ROWS, "every row reached the receiver"
    assert figures["resume after heal, first send (s)"] is not None
    # The bound is for transactions that hold something: row locks the monolith's updates would wait for,
    # a snapshot that holds vacuum back. One stranded right after its BEGIN holds neither (printed above).
    assert sampler.longest("idle_holding") <= TRANSACTION_TIMEOUT + SAMPLING_SLACK, figures
    assert exit_status == 0, output[-3000:]


def _await_open_write(cluster: NamespacedCluster, worker_address: str) -> bool:
    """Wait (a few seconds at most) for a moment when the worker has a writing transaction open.

    Partitioning then strands that transaction, which is what the bound is for; without it a partition
    that falls between two transactions would test nothing. Returns whether such a moment came.
    """
    deadline = time.monotonic() + OPEN_WRITE_WAIT
    with cluster.connect() as db:
        while time.monotonic() < deadline:
            row = db.execute(OPEN_WRITE, [worker_address]).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.002)
    return False


def _phase_at(marks: dict[str, float], moment: float) -> str:
    current = "clean"
    for phase, start in sorted(marks.items(), key=lambda item: item[1]):
        if start <= moment:
            current = phase
    return current


def _figures(
    marks: dict[str, float],
    sampler: ServerSampler,
    requests: list[Request],
    per_key: dict[str, int],
    left: int,
    leased: int,
    cluster: NamespacedCluster,
    output: str,
) -> dict[str, object]:
    seen: set[str] = set()
    repeats: dict[str, int] = {}
    sends: dict[str, int] = {}
    for request in sorted(requests, key=lambda r: r.at):
        phase = _phase_at(marks, request.at)
        sends[phase] = sends.get(phase, 0) + 1
        if request.key in seen:
            repeats[phase] = repeats.get(phase, 0) + 1
        seen.add(request.key)
    order = ["clean", "loss", "latency", "partition", "healed"]
    ends = {phase: marks.get(order[i + 1], marks["drained"]) for i, phase in enumerate(order[:-1])}
    ends["healed"] = marks["drained"]
    # The clean phase counts from the first request: the worker's start-up is not a rate of the link.
    starts = {**marks, "clean": min((r.at for r in requests), default=marks["clean"])}
    rates = {p: round(sends.get(p, 0) / max(ends[p] - starts[p], 1e-9), 1) for p in order}
    healed = marks["healed"]
    first_send = min((r.at for r in requests if r.at > healed), default=None)
    first_commit = sampler.first_sent_increase_after(healed)
    server_log = (cluster.dir / "server.log").read_text(errors="replace")
    return {
        "rows": ROWS,
        "rows not Sent at the partition / leased at its start": f"{left} / {leased}",
        "requests": len(requests),
        "duplicate sends": len(requests) - len(per_key),
        "duplicate sends by the fault in force when repeated": repeats,
        "sends/s by phase": rates,
        "resume after heal, first send (s)": None if first_send is None else round(first_send - healed, 2),
        "resume after heal, first Sent commit seen (s)": None
        if first_commit is None
        else round(first_commit - healed, 2),
        "drain after heal (s)": round(marks["drained"] - healed, 1),
        "longest idle in transaction, any phase (s)": round(sampler.longest("idle_in_transaction"), 2),
        "longest idle in transaction holding locks, an xid or a snapshot (s)": round(
            sampler.longest("idle_holding"), 2
        ),
        "longest idle in transaction, partition (s)": round(
            sampler.longest("idle_in_transaction", {"partition", "healed"}), 2
        ),
        "last statement of the session idle in transaction longest": sampler.longest_idle_query(),
        "oldest open transaction, any phase (s)": round(sampler.longest("oldest_transaction"), 2),
        "server ended an idle transaction (log lines)": server_log.count("idle-in-transaction timeout"),
        "worker log: tracebacks / lines": f"{output.count('Traceback')} / {output.count(chr(10))}",
        "sampler errors": len(sampler.errors),
    }
