"""A partition longer than the worker's TCP timeouts: the worker gives its connections up instead of
waiting on the kernel's retransmissions, and sends again soon after the link heals.

During a rate-limited drain the link between the worker's namespace and the servers' (PostgreSQL, the
receiver) drops every packet for LONG_PARTITION_SECONDS, then heals. A statement in flight at the
partition waits for an answer; with no TCP user timeout the kernel retransmits its request at doubling
intervals (…, 51, 102, 205 s after the first loss), so after a 110 s partition the next retransmission,
and so the worker's next statement, would come about 95 s after the heal. The worker's connections carry
``tcp_user_timeout`` (30 s), keepalives and ``connect_timeout`` (``delivery.session.TCP_SETTINGS``): the
stuck statement fails after 30 s, the tick ends as a database failure, and the loop tries again at its
back-off (at most 30 s), each new connection giving up after 10 s while the link is down.

Asserted: the first send after the heal comes within RESUME_BOUND; nothing is lost (every row Sent, one
outbox event each, once the drain ends). ``make faults`` runs it (root, ``ip netns``; skipped otherwise).
"""

from __future__ import annotations

import time

import pytest

from tests.faults.conftest import StartWorker, not_sent, seed_webhook_drain, stop_and_count
from tests.faults.servers import NamespacedCluster, Receiver
from tests.support.netns import NetworkPair
from tests.support.processes import wait_until, worker_env

pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

ROWS = 1500
#: Slow enough that the drain outlasts the partition: 1,500 rows at 10/s take 150 s of sending.
RATE = 10
LONG_PARTITION_SECONDS = 110.0
#: The loop's back-off cap (30 s) + one connect_timeout (10 s) + a tick's own start: with the kernel's
#: retransmissions alone the resume would come about 95 s after the heal.
RESUME_BOUND = 45.0


def test_a_partition_longer_than_the_tcp_timeouts_is_followed_by_a_prompt_resume(
    network: NetworkPair, cluster: NamespacedCluster, receiver: Receiver, start_worker: StartWorker
) -> None:
    seed_webhook_drain(cluster, receiver, ROWS, max_attempts=10, rate=RATE)
    env = worker_env(cluster.url, "postgres", {"WEBHOOK_ALLOWED_HOSTS": [network.servers.address]})
    worker = start_worker(env)
    try:
        wait_until(lambda: receiver.count() >= 50, 120, 0.1, "the worker sends through the clean link")
        network.partition()
        partitioned = time.monotonic()
        time.sleep(LONG_PARTITION_SECONDS)
        network.clear()
        healed = time.monotonic()
        try:
            wait_until(
                lambda: any(r.at > healed for r in receiver.requests()), 300, 0.1, "a send after the heal"
            )
        except AssertionError as exc:  # what the worker was doing: every thread's stack
            raise AssertionError(f"{exc}; the worker's log:\n{worker.abort_with_stacks()}") from None
        resume = min(r.at for r in receiver.requests() if r.at > healed) - healed
        wait_until(lambda: not_sent(cluster) == 0, 600, 0.5, "every row Sent")
    finally:
        network.clear()
    end = stop_and_count(worker, receiver, cluster)
    figures = {
        "fault method": network.method,
        "partition (s)": round(healed - partitioned, 1),
        "resume after heal, first send (s)": round(resume, 2),
        "requests / rows": f"{len(end.requests)} / {ROWS}",
        "duplicate sends": len(end.requests) - len(end.per_key),
        "worker ticks that failed on the database (log lines)": end.output.count(
            "retry-cycle-database-error"
        ),
        "worker exit status": end.exit_status,
    }
    print("\nlong partition figures:\n" + "\n".join(f"  {name}: {value}" for name, value in figures.items()))

    assert resume <= RESUME_BOUND, figures
    assert end.lost == 0
    assert (end.events, end.event_keys) == (ROWS, ROWS)
    assert len(end.per_key) == ROWS, "every row reached the receiver"
    assert end.exit_status == 0, end.output[-3000:]
