"""SIGTERM stops the worker within its channel timeout + 2 s whatever the provider does: one that never
answers (and ignores its own deadline), one whose answer raises inside the client."""

from __future__ import annotations

import re
import signal

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
def test_sigterm_stops_within_the_timeout_plus_two_seconds(start_worker, tmp_path, provider, options):
    call_log = tmp_path / "calls.log"
    call_log.touch()
    channel = ChannelConfig.objects.create(
        key="hostile",
        provider_key=provider,
        options={**options, "call_log": str(call_log)},
        timeout_seconds=TIMEOUT,
        max_concurrency=4,
        max_attempts=50,
        backoff_base_seconds=1,
    )
    seed_due(channel, 200)
    worker = start_worker(LOOP, {"PROVIDERS": PROVIDERS})
    # The signal goes once calls are in flight (the provider logs each call as it starts): the case the
    # bound is about. A fixed pause after the tick's start sent it, on a loaded machine, while the first
    # claim still ran.
    wait_until(lambda: call_log.read_text().count("\n") >= 4, 60, 0.01, "calls in flight")
    worker.send(signal.SIGTERM)
    status = worker.wait(TIMEOUT + 10)
    output = worker.output()
    assert status == 0, output[-3000:]
    # The stop as the worker measures it (calls abandoned, rows given back, lock released, threads
    # closed): the interpreter's exit after it, timed from here, took 2 s more under two CPU hogs.
    stopped = re.search(r"worker-stopped\s.*after_stop_s=([0-9.]+)", output)
    assert stopped, output[-3000:]
    assert float(stopped.group(1)) <= TIMEOUT + 2, output[-3000:]
    assert "Traceback" not in worker.output(), worker.output()[-3000:]
