"""A worker draining webhook rows runs one thread, its own: it runs the send loop, whose tasks are the
calls, the claims and the commits (the issue's bound is two). So does one draining a backlog of inline
rows, with two claims under way at once. Read from ``/proc/<pid>/task`` of a real ``retry_worker``
process."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from notifications_retry.models import ChannelConfig, NotificationEntity
from tests.process.conftest import StartWorker, seed_due
from tests.process.helpers import webhook_channel
from tests.support.http_server import Reply, ScriptedServer
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ROWS = 600


@pytest.fixture
def slow_receiver() -> Iterator[ScriptedServer]:
    # 20 ms an answer: at 16 calls in flight the drain lasts long enough to be sampled often.
    server = ScriptedServer(lambda request: Reply(200, {"id": "m"}, delay=0.02)).start()
    yield server
    server.stop()


def threads_of(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return 0


def test_a_webhook_drain_runs_one_thread(start_worker: StartWorker, slow_receiver: ScriptedServer):
    channel = webhook_channel(slow_receiver.url, max_concurrency=16)
    seed_due(channel, ROWS)
    worker = start_worker(
        ["--batch-size", str(ROWS * 2), "--max-duration", "120"],
        {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"], "INTERVAL_SECONDS": 60.0},
    )
    samples: list[int] = []
    deadline = time.monotonic() + 120
    # Sampled while calls are in flight: from the first request to the last row's outcome.
    wait_until(lambda: len(slow_receiver.requests) > 0, 60, message="the first request")
    while time.monotonic() < deadline:
        samples.append(threads_of(worker.pid))
        if NotificationEntity.objects.filter(status=NotificationEntity.Status.SENT).count() == ROWS:
            break
        time.sleep(0.01)
    assert NotificationEntity.objects.filter(status=NotificationEntity.Status.SENT).count() == ROWS
    assert len(samples) >= 10, "the drain was sampled while it ran"
    assert max(samples) == 1, sorted(set(samples))
    assert worker.alive()


INLINE_ROWS = 20_000


def test_an_inline_backlog_runs_one_thread_with_two_claims_under_way(start_worker: StartWorker):
    channel = ChannelConfig.objects.create(key="inbox", provider_key="in_app", max_attempts=5)
    seed_due(channel, INLINE_ROWS)
    # Claims of a whole chunk (500 rows) come back full: from the first on, two are under way at once.
    worker = start_worker(
        ["--batch-size", str(INLINE_ROWS * 2), "--max-duration", "120"], {"INTERVAL_SECONDS": 60.0}
    )
    sent = NotificationEntity.objects.filter(status=NotificationEntity.Status.SENT)
    samples: list[int] = []
    deadline = time.monotonic() + 120
    wait_until(lambda: sent.exists(), 60, message="the first row sent")
    while time.monotonic() < deadline and sent.count() < INLINE_ROWS:
        samples.append(threads_of(worker.pid))
        time.sleep(0.01)
    assert sent.count() == INLINE_ROWS
    assert len(samples) >= 10, "the drain was sampled while it ran"
    assert max(samples) == 1, sorted(set(samples))
    assert worker.alive()
