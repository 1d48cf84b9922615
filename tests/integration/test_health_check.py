"""Liveness: a lane whose last completed tick is older than the threshold is unhealthy."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from notifications_retry.delivery.session import TRANSACTION_TIMEOUT_SECONDS
from notifications_retry.engine.worker import Worker
from notifications_retry.models import WorkerHeartbeat
from notifications_retry.observability.liveness import check_liveness
from tests.factories import ChannelFactory

REPO_ROOT = Path(__file__).resolve().parents[2]


def beat(completed_at, lane="default"):
    return WorkerHeartbeat.objects.create(lane=lane, last_tick_completed_at=completed_at)


@pytest.mark.django_db
def test_no_heartbeat_is_unhealthy(clock):
    verdict = check_liveness(clock=clock)
    assert not verdict.healthy
    assert verdict.reason == "no tick has completed yet"


@pytest.mark.django_db
def test_a_started_but_never_completed_tick_is_unhealthy(clock):
    WorkerHeartbeat.objects.create(lane="default", last_tick_started_at=clock.now())
    assert not check_liveness(clock=clock).healthy


@pytest.mark.django_db
def test_a_tick_makes_the_lane_healthy_until_the_threshold_passes(clock):
    ChannelFactory(key="in_app")
    Worker(clock=clock, rng=random.Random(1)).tick()
    fresh = check_liveness(clock=clock, max_age=120)
    assert fresh.healthy, fresh.describe()
    assert fresh.last_completed_at == clock.now()

    clock.advance(120)
    assert check_liveness(clock=clock, max_age=120).healthy  # exactly at the threshold: still alive
    clock.advance(1)
    stale = check_liveness(clock=clock, max_age=120)
    assert not stale.healthy
    assert stale.age_seconds == 121
    assert "last tick completed 121s ago (max 120s" in stale.describe()


@pytest.mark.django_db
def test_default_threshold_is_two_intervals_and_a_tick_at_least_180_s(clock):
    beat(clock.now() - timedelta(seconds=200))
    assert not check_liveness(clock=clock).healthy  # defaults: 2 x 60 + 45 = 165, raised to 180
    with override_settings(NOTIFICATIONS_RETRY={"INTERVAL_SECONDS": 80, "MAX_DURATION_SECONDS": 45}):
        assert check_liveness(clock=clock).healthy  # 2 x 80 + 45 = 205
        assert check_liveness(clock=clock).max_age_seconds == 205
    with override_settings(NOTIFICATIONS_RETRY={"INTERVAL_SECONDS": 5, "MAX_DURATION_SECONDS": 4}):
        assert check_liveness(clock=clock).max_age_seconds == 180  # a short interval keeps the floor


@pytest.mark.django_db
def test_lanes_are_checked_separately(clock):
    WorkerHeartbeat.objects.create(lane="default", last_tick_completed_at=clock.now())
    WorkerHeartbeat.objects.create(lane="bulk", last_tick_completed_at=clock.now() - timedelta(hours=1))
    assert check_liveness("default", clock=clock).healthy
    assert not check_liveness("bulk", clock=clock).healthy


@pytest.mark.django_db
def test_check_command_reports_healthy_on_stdout():
    WorkerHeartbeat.objects.create(lane="default", last_tick_completed_at=timezone.now())
    out = io.StringIO()
    call_command("retry_worker", "--check", stdout=out)
    assert out.getvalue().startswith("healthy: lane 'default'")


@pytest.mark.django_db
def test_check_command_fails_with_status_1_when_stale():
    beat(timezone.now() - timedelta(minutes=10))
    with pytest.raises(CommandError) as excinfo:
        call_command("retry_worker", "--check")
    assert excinfo.value.returncode == 1
    assert "unhealthy: lane 'default'" in str(excinfo.value)
    call_command("retry_worker", "--check", "--max-age", "3600", stdout=io.StringIO())


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-age", "30"], "--max-age only applies to --check"),
        (["--check", "--once"], "cannot be combined with --once"),
        (["--check", "--lane", "nope"], "unknown lane 'nope'"),
    ],
)
def test_check_misuse_is_a_usage_error(args, message):
    with pytest.raises(CommandError) as excinfo:
        call_command("retry_worker", *args)
    assert excinfo.value.returncode == 2
    assert message in str(excinfo.value)


def _check_process(*args: str, database: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(
        {
            "NR_TEST_DATABASE_NAME": database or connection.settings_dict["NAME"],
            "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        }
    )
    return subprocess.run(
        [sys.executable, "manage.py", "retry_worker", "--check", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_probe_exit_status_as_a_liveness_probe_sees_it():
    assert _check_process().returncode == 1  # no tick ever completed
    beat(timezone.now() - timedelta(seconds=30))
    healthy = _check_process("--max-age", "60")
    assert healthy.returncode == 0, healthy.stderr
    stale = _check_process("--max-age", "10")
    assert stale.returncode == 1
    assert "unhealthy" in stale.stderr
    assert _check_process("--max-age", "-1").returncode == 2


@pytest.mark.process
@pytest.mark.django_db
def test_probe_fails_when_the_database_cannot_be_read():
    result = _check_process(database="nr_no_such_database")
    assert result.returncode == 1
    assert "unhealthy: lane 'default': cannot read the heartbeat" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_write_is_bounded_like_the_workers_other_transactions(clock, monkeypatch):
    # The upsert locks the lane's row: a partition that strands it must not hold that lock for long.
    seen: list[tuple[str, str]] = []
    real = WorkerHeartbeat.objects.bulk_create

    def recording(*args, **kwargs):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('idle_in_transaction_session_timeout'), "
                "current_setting('statement_timeout')"
            )
            seen.append(cursor.fetchone())
        return real(*args, **kwargs)

    monkeypatch.setattr(WorkerHeartbeat.objects, "bulk_create", recording)
    worker = Worker(batch_size=10, max_duration=5, clock=clock)
    try:
        worker.run(once=True)
    finally:
        worker.close()
    bound = f"{TRANSACTION_TIMEOUT_SECONDS:g}s"  # the server's defaults are 0: no bound
    assert seen and set(seen) == {(bound, bound)}, seen
