"""``manage.py retry_worker`` as a user runs it: options, exit codes, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory

ROOT = Path(__file__).resolve().parents[2]


def run_command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "NR_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
    }
    return subprocess.run(
        [sys.executable, "-m", "django", "retry_worker", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.django_db(transaction=True)
def test_once_runs_one_tick_and_exits_zero():
    channel = ChannelFactory(key="in_app")
    record = NotificationFactory(
        channel=channel, status="failed", attempts=1, next_attempt_at=timezone.now() - timedelta(minutes=1)
    )
    result = run_command("--once")
    assert result.returncode == 0, result.stderr
    record.refresh_from_db()
    assert record.status == NotificationEntity.Status.SENT
    assert "cycle-completed" in result.stdout + result.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "must be >= 1"),
        (["--batch-size", "ten"], "expected a whole number"),
        (["--interval", "-5"], "must be >= 0"),
        (["--max-duration", "0"], "must be > 0"),
        (["--lane", "nope", "--once"], "unknown lane 'nope'"),
    ],
)
def test_bad_options_exit_2_with_a_clear_message(args, message):
    channel = ChannelFactory(key="in_app")
    record = NotificationFactory(
        channel=channel, status="failed", attempts=1, next_attempt_at=timezone.now() - timedelta(minutes=1)
    )
    result = run_command(*args)
    assert result.returncode == 2
    assert message in result.stderr
    record.refresh_from_db()
    assert record.status == NotificationEntity.Status.FAILED and record.attempts == 1


@pytest.mark.django_db
def test_call_command_once_in_process():
    ChannelFactory(key="in_app")
    call_command("retry_worker", "--once", "--batch-size", "10", "--max-duration", "5")


@pytest.mark.django_db
def test_migrations_are_complete():
    call_command("makemigrations", "notifications_retry", "--check", "--dry-run", verbosity=0)
