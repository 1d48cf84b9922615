"""SIGTERM stops the worker within its channel timeout + 2 s whatever the provider does: one that never
answers (and ignores its own deadline), one whose answer raises inside the client."""

from __future__ import annotations

import signal
import time

import pytest

from notifications_retry.models import ChannelConfig
from tests.process.conftest import seed_due
from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

PROVIDERS = {
    "deadline_ignoring": "tests.support.fault_providers.DeadlineIgnoringProvider",
    "absurd_answer": "tests.support.fault_providers.AbsurdAnswerProvider",
}
LOOP = ["--interval", "0.2", "--batch-size", "50", "--max-duration", "30"]
TIMEOUT = 1.0


@pytest.mark.parametrize(
    ("provider", "options"),
    [("deadline_ignoring", {}), ("absurd_answer", {"answer": "overflow"})],
    ids=["never-answers", "raises-inside-the-client"],
)
def test_sigterm_stops_within_the_timeout_plus_two_seconds(start_worker, provider, options):
    channel = ChannelConfig.objects.create(
        key="hostile",
        provider_key=provider,
        options=options,
        timeout_seconds=TIMEOUT,
        max_concurrency=4,
        max_attempts=50,
        backoff_base_seconds=1,
    )
    seed_due(channel, 200)
    worker = start_worker(LOOP, {"PROVIDERS": PROVIDERS})
    wait_until(lambda: "retry-cycle-started" in worker.output(), 30, message="a tick started")
    time.sleep(0.5)
    worker.send(signal.SIGTERM)
    signalled = time.monotonic()
    status = worker.wait(TIMEOUT + 10)
    elapsed = time.monotonic() - signalled
    assert status == 0, worker.output()[-3000:]
    assert elapsed <= TIMEOUT + 2, (elapsed, worker.output()[-3000:])
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
