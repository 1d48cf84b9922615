"""A stop signal only sets the worker's stop flag: its handler writes no log line.

The handler runs on the worker's thread between two of its steps, maybe inside the write of a log line:
structlog's PrintLogger holds a lock while it writes, and a handler that logged waited for that lock
forever (a worker that never stopped on SIGTERM). The worker says ``stop-requested`` at its next look at
the flag instead."""

from __future__ import annotations

import signal

import pytest
from structlog.testing import capture_logs

from notifications_retry.engine.worker import Worker


@pytest.fixture
def restored_handlers():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.django_db
def test_the_handler_only_flags_the_stop_and_the_next_look_says_it(clock, restored_handlers):
    worker = Worker(clock=clock)
    try:
        worker.install_signal_handlers()
        handler = signal.getsignal(signal.SIGTERM)
        with capture_logs() as in_handler:
            handler(signal.SIGTERM, None)
        assert in_handler == [], "the handler logged"
        with capture_logs() as after:
            assert worker.stopping
            assert worker.stopping
        [said] = [e for e in after if e["event"] == "stop-requested"]
        assert said["signal"] == "SIGTERM"
    finally:
        worker.close()
