"""A hung pod among working ones fails its own probe: two partitioned workers, each with its
``--heartbeat-file``; one is frozen (SIGSTOP). Its probe fails while the other's, and the lane's,
stay healthy; resumed, it beats again."""

from __future__ import annotations

import io
import json
import signal
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support.processes import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

LOOP = ["--interval", "0.2", "--max-duration", "5"]
MAX_AGE = "2"


def probe(*args: str) -> tuple[bool, str]:
    out = io.StringIO()
    try:
        call_command("retry_worker", "--check", "--max-age", MAX_AGE, *args, stdout=out)
    except CommandError as exc:
        return False, str(exc)
    return True, out.getvalue()


def test_a_frozen_worker_fails_its_own_probe_while_the_lane_stays_healthy(start_worker, tmp_path):
    files = [tmp_path / "a.heartbeat", tmp_path / "b.heartbeat"]
    workers = [
        start_worker([*LOOP, "--heartbeat-file", str(path)], {"PARTITIONS": 4}, name=path.stem)
        for path in files
    ]
    for path, worker in zip(files, workers, strict=True):
        wait_until(lambda p=path: probe("--heartbeat-file", str(p))[0], 60, message=f"{path.name} healthy")
        assert json.loads(path.read_text())["pid"] == worker.pid
    # Both own their share (the file names the partitions): frozen earlier, the first worker would hold
    # all four until its lock session times out, and the lane would stop ticking too.
    wait_until(
        lambda: all(len(json.loads(path.read_text())["partitions"]) == 2 for path in files),
        60,
        message="two partitions each",
    )
    frozen, working = workers
    frozen.send(signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        wait_until(
            lambda: not probe("--heartbeat-file", str(files[0]))[0], 30, message="the frozen probe fails"
        )
        assert time.monotonic() - stopped_at >= float(MAX_AGE) - 0.5  # not before its max age
        healthy, why = probe("--heartbeat-file", str(files[0]))
        assert not healthy and f"pid {frozen.pid}" in why, why
        assert probe("--heartbeat-file", str(files[1]))[0]  # the working pod
        # The lane's row: the working pod takes the free partitions (within a look, 2 s) and keeps
        # ticking it, so the lane's probe passes while the frozen pod's own still fails.
        wait_until(lambda: probe()[0], 30, message="the lane healthy")
        assert not probe("--heartbeat-file", str(files[0]))[0]
    finally:
        frozen.send(signal.SIGCONT)
    wait_until(
        lambda: probe("--heartbeat-file", str(files[0]))[0], 30, message="the resumed worker beats again"
    )
    assert working.proc is not None and working.proc.poll() is None
