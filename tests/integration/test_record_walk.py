"""docs/architecture.md's walk of one webhook record is the path its code really takes.

A profiler on every thread records which functions of the package run, in order, while a real tick
claims one due webhook row, sends it to a real HTTP server and commits its outcome. The walk is read
from the page: each step's file and function must run in the page's order; ``pytest -s`` prints every
module that ran from the start of the tick's loop to the commit (the count docs/architecture.md gives).
"""

from __future__ import annotations

import os
import random
import sys
import threading
from datetime import timedelta
from types import FrameType
from typing import Any

import pytest

import notifications_retry
from notifications_retry.engine.worker import Worker
from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.architecture_doc import walk

PACKAGE = os.path.dirname(notifications_retry.__file__)
#: docs/architecture.md, "One webhook record, from claim to committed outcome": (file, function).
WALK = walk()


def in_order(walk: list[tuple[str, str]], trace: list[tuple[str, str]]) -> bool:
    """Whether ``walk`` is a subsequence of ``trace``."""
    rest = iter(trace)
    return all(step in rest for step in walk)


@pytest.mark.django_db(transaction=True)
def test_one_webhook_record_takes_the_documented_walk(clock, webhook_server):
    channel = ChannelFactory(key="webhook", provider_key="webhook", options={"url": webhook_server.url})
    NotificationFactory(
        channel=channel,
        status=NotificationEntity.Status.FAILED,
        attempts=1,
        next_attempt_at=clock.now() - timedelta(seconds=5),
    )
    worker = Worker(clock=clock, rng=random.Random(7))
    trace: list[tuple[str, str]] = []
    guard = threading.Lock()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(PACKAGE):
            step = (os.path.relpath(path, PACKAGE), frame.f_code.co_qualname)
            with guard:
                trace.append(step)

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        stats = worker.tick()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        worker.close()
    assert stats.sent == 1
    assert WALK[0] == ("engine/dispatcher.py", "Dispatcher.run"), "the walk starts at the tick's loop"
    begin = trace.index(WALK[0])
    # The walk ends where the record's commit begins: the commit is a task of the send loop, so the
    # dispatcher's next passes (another claim) interleave with the rest of the commit's statements.
    end = min(
        i
        for i, (path, name) in enumerate(trace)
        if path == "delivery/finalize.py" and name in ("finalize_async", "finalize")
    )
    window = trace[begin : end + 1]
    files: list[str] = []
    for path, _ in window:
        if path not in files:
            files.append(path)
    print(f"\n{len(files)} modules from the tick's loop to the commit:", *files, sep="\n  ")
    assert in_order(WALK, window), [step for step in WALK if step not in window] or window
    assert not in_order([*WALK, WALK[1]], window), "the check sees a step out of place"
