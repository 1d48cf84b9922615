"""A worker process's own heartbeat file (``--heartbeat-file``) and the probe that reads it."""

from __future__ import annotations

import io
import json
import os
import random

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from structlog.testing import capture_logs

from notifications_retry.engine.worker import Worker
from notifications_retry.observability.heartbeat_file import BEAT_SECONDS, HeartbeatFile, read_age
from notifications_retry.observability.liveness import check_process_liveness
from tests.factories import ChannelFactory


def test_a_beat_writes_pid_lane_partitions_and_time_whole(tmp_path):
    path = tmp_path / "beat"
    beat = HeartbeatFile(path, lane="bulk")
    assert beat.due(1000.0)
    beat.beat(1000.0, [0, 2])
    assert json.loads(path.read_text()) == {
        "pid": os.getpid(),
        "lane": "bulk",
        "partitions": [0, 2],
        "at": 1000.0,
    }
    assert not beat.due(1000.0 + BEAT_SECONDS - 0.1)
    assert beat.due(1000.0 + BEAT_SECONDS)
    beat.beat(1010.0)
    assert read_age(path, 1012.5) == (
        2.5,
        {"pid": os.getpid(), "lane": "bulk", "partitions": [], "at": 1010.0},
    )
    assert [p.name for p in tmp_path.iterdir()] == ["beat"]  # no temporary file left behind


def test_the_probe_is_healthy_until_the_max_age_passes(tmp_path):
    path = tmp_path / "beat"
    HeartbeatFile(path, lane="default").beat(500.0, [1])
    fresh = check_process_liveness(str(path), max_age=60, now=560.0)
    assert fresh.healthy, fresh.describe()
    assert "process last beat 60s ago (max 60s; pid" in fresh.describe()
    stale = check_process_liveness(str(path), max_age=60, now=561.0)
    assert not stale.healthy
    assert stale.age_seconds == 61
    assert "partitions [1]" in stale.describe()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "no heartbeat written to"),
        ("{not json", "cannot read the heartbeat file"),
        ('{"pid": 1}', "not a heartbeat file"),
        ('["at"]', "not a heartbeat file"),
        ('{"pid": 1, "lane": "bulk", "at": 500}', "is lane 'bulk''s heartbeat"),
    ],
)
def test_a_missing_broken_or_foreign_file_is_unhealthy_with_its_reason(tmp_path, content, reason):
    path = tmp_path / "beat"
    if content is not None:
        path.write_text(content)
    verdict = check_process_liveness(str(path), max_age=60, now=510.0)
    assert not verdict.healthy
    assert reason in verdict.describe()


@pytest.mark.django_db
def test_an_unwritable_path_is_logged_once_and_the_tick_still_runs(tmp_path, clock):
    ChannelFactory(key="in_app")
    worker = Worker(clock=clock, rng=random.Random(1), heartbeat_file=str(tmp_path / "missing-dir" / "beat"))
    with capture_logs() as logs:
        ticks = worker.run(once=True)  # beats before and after the tick: both fail
    assert len(ticks) == 1 and not ticks[0].error
    failed = [e for e in logs if e["event"] == "heartbeat-file-failed"]
    assert len(failed) == 1 and "missing-dir" in failed[0]["path"]


@pytest.mark.django_db(transaction=True)
def test_a_once_worker_writes_the_file_the_check_command_reads(tmp_path):
    ChannelFactory(key="in_app")
    path = tmp_path / "beat"
    call_command(
        "retry_worker", "--once", "--heartbeat-file", str(path), "--skip-checks", stdout=io.StringIO()
    )
    assert json.loads(path.read_text())["pid"] == os.getpid()
    out = io.StringIO()
    call_command("retry_worker", "--check", "--heartbeat-file", str(path), stdout=out)
    assert out.getvalue().startswith("healthy: lane 'default': process last beat")
    os.utime(path)  # the mtime is not what counts: the time inside the file is
    body = json.loads(path.read_text())
    body["at"] -= 181
    path.write_text(json.dumps(body))
    with pytest.raises(CommandError, match=r"unhealthy: lane 'default': process last beat 18[12]s") as err:
        call_command("retry_worker", "--check", "--heartbeat-file", str(path))
    assert err.value.returncode == 1
