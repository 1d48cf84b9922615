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

import json
import signal
import time

import pytest

from tests.faults.conftest import StartWorker
from tests.faults.servers import NamespacedCluster, Receiver
from tests.process.conftest import INSERT_DUE
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
CHANNEL = """
INSERT INTO notifications_retry_channelconfig (key, is_enabled, provider_key, max_attempts,
    retry_backoff, backoff_base_seconds, backoff_cap_seconds, timeout_seconds, max_concurrency,
    rate_limit_per_second, options, created_at, updated_at)
VALUES ('hook', true, 'webhook', 10, 'exponential', 1, 60, 10.0, 10, %s, %s, now(), now()) RETURNING id
"""
NOT_SENT = "SELECT count(*) FROM notifications_retry_notificationentity WHERE status <> 'sent'"
EVENTS = "SELECT count(*), count(DISTINCT key) FROM notifications_retry_outbox"


def test_a_partition_longer_than_the_tcp_timeouts_is_followed_by_a_prompt_resume(
    network: NetworkPair, cluster: NamespacedCluster, receiver: Receiver, start_worker: StartWorker
) -> None:
    with cluster.connect() as db:
        channel = db.execute(CHANNEL, [RATE, json.dumps({"url": receiver.url})]).fetchone()
        assert channel is not None
        db.execute(INSERT_DUE, {"channel": channel[0], "count": ROWS, "attempts": 1})
    env = worker_env(cluster.url, "postgres", {"WEBHOOK_ALLOWED_HOSTS": [network.servers.address]})
    worker = start_worker(env)
    try:
        wait_until(lambda: receiver.count() >= 50, 120, 0.1, "the worker sends through the clean link")
        network.partition()
        partitioned = time.monotonic()
        time.sleep(LONG_PARTITION_SECONDS)
        network.clear()
        healed = time.monotonic()
        wait_until(lambda: any(r.at > healed for r in receiver.requests()), 300, 0.1, "a send after the heal")
        resume = min(r.at for r in receiver.requests() if r.at > healed) - healed
        wait_until(lambda: _not_sent(cluster) == 0, 600, 0.5, "every row Sent")
    finally:
        network.clear()
    worker.send(signal.SIGTERM)
    exit_status = worker.wait(60)
    output = worker.output()
    requests = receiver.requests()
    per_key = Receiver.per_key(requests)
    with cluster.connect() as db:
        events, event_keys = db.execute(EVENTS).fetchone() or (0, 0)
    figures = {
        "fault method": network.method,
        "partition (s)": round(healed - partitioned, 1),
        "resume after heal, first send (s)": round(resume, 2),
        "requests / rows": f"{len(requests)} / {ROWS}",
        "duplicate sends": len(requests) - len(per_key),
        "worker ticks that failed on the database (log lines)": output.count("retry-cycle-database-error"),
        "worker exit status": exit_status,
    }
    print("\nlong partition figures:\n" + "\n".join(f"  {name}: {value}" for name, value in figures.items()))

    assert resume <= RESUME_BOUND, figures
    assert _not_sent(cluster) == 0
    assert (events, event_keys) == (ROWS, ROWS)
    assert len(per_key) == ROWS, "every row reached the receiver"
    assert exit_status == 0, output[-3000:]


def _not_sent(cluster: NamespacedCluster) -> int:
    with cluster.connect() as db:
        row = db.execute(NOT_SENT).fetchone()
    return int(row[0]) if row else -1
