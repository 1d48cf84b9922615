"""A recovery command killed with SIGKILL midway loses nothing and requeues nothing twice; resumed, the job
completes. Real subprocesses on the test database. The 200,000-row run is a soak scenario
(``make recovery-soak``); the default suite runs the same scenario on 20,000 rows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Max

from notifications_retry.models import DeadLetterAction, NotificationEntity, RecoveryJob
from tests.factories import ChannelFactory
from tests.support.dead_letters import seed_dead_letters
from tests.support.processes import REPO_ROOT, wait_until, worker_env

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SINCE = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
FILTER = ["--channel", "hook", "--since", "2026-03-01T02:00:00Z", "--until", "2026-03-01T08:00:00Z"]


def recover(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = worker_env(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
        connection.settings_dict["NAME"],
    )
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", "notifications_recover", *args],
            env=env,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def committed_state() -> tuple[int, int, int]:
    """(job.done, rows requeued, audit rows): the job's count must always equal what was committed."""
    job = RecoveryJob.objects.get()
    return (
        job.done,
        NotificationEntity.objects.filter(requeue_count__gte=1).count(),
        DeadLetterAction.objects.filter(action="requeue").count(),
    )


def kill_midway_then_resume(rows: int, tmp_path: Path) -> None:
    hook = ChannelFactory(
        key="hook", provider_key="webhook", max_attempts=5, options={"url": "http://127.0.0.1:9/"}
    )
    seed_dead_letters(ChannelFactory(key="other", max_attempts=5), 100, first=SINCE)
    seed_dead_letters(hook, rows, first=SINCE, step_us=50_000)
    log = tmp_path / "recover.log"

    first = recover([*FILTER, "--chunk-size", "200", "--reason", "partner outage"], log)
    try:
        wait_until(
            lambda: RecoveryJob.objects.filter(done__gte=rows // 3).exists(),
            timeout=600,
            interval=0.02,
            message="a third of the rows requeued",
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)

    done, requeued, audited = committed_state()
    assert 0 < done < rows, log.read_text()
    assert done == requeued == audited, (done, requeued, audited)  # the count committed with its chunk
    job = RecoveryJob.objects.get()
    assert job.state == "running"  # killed: nobody marked it, and it is resumable

    # The same filter again is refused (the killed job still covers it) and points at --resume.
    again = recover(FILTER, log)
    assert again.wait(60) == 1
    assert (
        f"already covers this filter: resume it (notifications_recover --resume {job.pk})" in log.read_text()
    )

    resumed = recover(["--resume", str(job.pk), "--chunk-size", "1000"], log)
    assert resumed.wait(600) == 0, log.read_text()[-4000:]

    job.refresh_from_db()
    assert (job.state, job.total, job.done, job.failed) == ("done", rows, rows, 0), log.read_text()[-4000:]
    recovered = NotificationEntity.objects.filter(channel=hook)
    assert recovered.filter(requeue_count=1, dead_lettered_at=None, attempts=0).count() == rows
    assert recovered.aggregate(most=Max("requeue_count"))["most"] == 1  # nothing requeued twice
    assert DeadLetterAction.objects.filter(action="requeue").count() == rows
    assert set(DeadLetterAction.objects.values_list("reason", flat=True)) == {
        f"recovery job #{job.pk}: partner outage"
    }
    assert NotificationEntity.objects.filter(channel__key="other", requeue_count=0).count() == 100
    assert f"recovery job #{job.pk} done: requeued" in log.read_text()


def test_a_recovery_killed_midway_loses_nothing_repeats_nothing_and_resumes(tmp_path):
    kill_midway_then_resume(20_000, tmp_path)


@pytest.mark.soak
def test_a_200000_row_recovery_survives_a_sigkill(tmp_path):
    kill_midway_then_resume(200_000, tmp_path)


def test_sigterm_stops_after_the_chunk_in_hand_and_a_runner_finishes_the_job(tmp_path):
    hook = ChannelFactory(
        key="hook", provider_key="webhook", max_attempts=5, options={"url": "http://127.0.0.1:9/"}
    )
    seed_dead_letters(hook, 20_000, first=SINCE, step_us=50_000)
    log = tmp_path / "recover.log"
    first = recover([*FILTER, "--chunk-size", "200"], log)
    try:
        wait_until(lambda: RecoveryJob.objects.filter(done__gte=2000).exists(), timeout=300, interval=0.02)
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0, log.read_text()[-4000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    job = RecoveryJob.objects.get()
    done, requeued, audited = committed_state()
    assert job.state == "pending" and 0 < done < 20_000 and done == requeued == audited
    assert f"stopped, resume with --resume {job.pk}" in log.read_text()

    runner = recover(["--work", "--once"], log)
    assert runner.wait(300) == 0, log.read_text()[-4000:]
    job.refresh_from_db()
    assert (job.state, job.done) == ("done", 20_000)
    assert NotificationEntity.objects.aggregate(most=Max("requeue_count"))["most"] == 1
