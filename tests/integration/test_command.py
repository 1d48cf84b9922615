"""``manage.py retry_worker`` as a user runs it: options, exit codes, clear errors."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.checks.registry import registry
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

import notifications_retry
from notifications_retry.database.locks import AdvisoryLock
from notifications_retry.management.commands.retry_worker import YOUNG_THRESHOLD
from notifications_retry.models import NotificationEntity, WorkerHeartbeat
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.databases import closed_port, scratch_database

ROOT = Path(__file__).resolve().parents[2]


def command_env(database_url: str | None = None, database_name: str | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "NR_TEST_DATABASE_NAME": database_name or connection.settings_dict["NAME"],
    }
    if database_url:
        env["DATABASE_URL"] = database_url
    return env


def run_command(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "django", "retry_worker", *args],
        cwd=ROOT,
        env=env or command_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


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
        (["--interval", "-5"], "must be > 0"),
        (["--interval", "0"], "must be > 0"),
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
def test_call_command_once_in_process_completes_a_tick_with_nothing_due():
    channel = ChannelFactory(key="in_app")
    later = NotificationFactory(
        channel=channel, status="pending", scheduled_at=timezone.now() + timedelta(hours=1)
    )
    call_command("retry_worker", "--once", "--batch-size", "10", "--max-duration", "5")
    heartbeat = WorkerHeartbeat.objects.get(lane="default")
    assert heartbeat.last_tick_completed_at is not None
    assert heartbeat.last_tick_stats["processed"] == 0
    assert heartbeat.last_tick_stats["skipped"] is False and heartbeat.last_tick_stats["error"] == ""
    later.refresh_from_db()
    assert later.status == NotificationEntity.Status.PENDING and later.attempts == 0


@pytest.mark.django_db
def test_the_command_sets_the_collector_for_a_long_run():
    thresholds = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)  # CPython's default
    try:
        call_command("retry_worker", "--once", "--batch-size", "10", "--max-duration", "5")
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def test_once_with_the_database_unreachable_exits_3_with_one_line_and_no_traceback():
    port = closed_port()
    result = run_command(
        "--once", env=command_env(f"postgres://postgres@127.0.0.1:{port}/nr_nowhere", "nr_nowhere")
    )
    assert result.returncode == 3, result.stderr
    assert stderr_lines(result) == [
        f"CommandError: database 'nr_nowhere' on 127.0.0.1:{port} is unreachable: connection failed: "
        f'connection to server at "127.0.0.1", port {port} failed: Connection refused'
    ]
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert "lock held" not in output and "retry-cycle-skipped" not in output
    assert output.count("retry-cycle-database-error") == 1


def test_once_with_the_database_unreachable_and_traceback_shows_it():
    env = command_env(f"postgres://postgres@127.0.0.1:{closed_port()}/nr_nowhere", "nr_nowhere")
    result = run_command("--once", "--traceback", env=env)
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "is unreachable" in result.stderr


@pytest.mark.django_db
def test_once_on_an_unmigrated_database_exits_4_and_says_run_migrate():
    with scratch_database("nr_unmigrated") as empty:
        result = run_command("--once", env=command_env(empty.url, empty.name))
    assert result.returncode == 4, result.stderr
    (line,) = stderr_lines(result)
    assert line.startswith(f"CommandError: database '{empty.name}' on ")
    assert "is not migrated (relation " in line and line.endswith(": run manage.py migrate")
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.django_db(transaction=True)
def test_once_while_another_instance_holds_the_lock_exits_0_and_says_so():
    channel = ChannelFactory(key="in_app")
    record = NotificationFactory(
        channel=channel, status="failed", attempts=1, next_attempt_at=timezone.now() - timedelta(minutes=1)
    )
    holder = AdvisoryLock("notifications:retry-worker")
    assert holder.acquire()
    try:
        result = run_command("--once")
    finally:
        holder.close()
    assert result.returncode == 0, result.stderr
    assert "retry-cycle-skipped" in result.stdout and "lock held by another instance" in result.stdout
    assert stderr_lines(result) == []
    record.refresh_from_db()
    assert record.status == NotificationEntity.Status.FAILED and record.attempts == 1


def test_the_loop_backs_off_with_one_line_per_failed_tick_and_stops_cleanly():
    env = command_env(f"postgres://postgres@127.0.0.1:{closed_port()}/nr_nowhere", "nr_nowhere")
    env["PYTHONUNBUFFERED"] = "1"
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "retry_worker", "--interval", "0.1", "--max-duration", "0.05"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    first_tick = threading.Event()

    def read(stream: Any) -> None:
        for line in stream:
            lines.append(line)
            if "retry-cycle-database-error" in line:
                first_tick.set()

    readers = [
        threading.Thread(target=read, args=(s,), daemon=True) for s in (process.stdout, process.stderr)
    ]
    for reader in readers:
        reader.start()
    try:
        # Counted from the first failed tick, not from the start: a loaded machine may take seconds to
        # import Django, and a SIGTERM before the handlers are installed would kill the process.
        assert first_tick.wait(60), "".join(lines)
        time.sleep(4.5)  # ticks at 0, 1 and 3 s (back-off 1 s, 2 s, 4 s) instead of 45 at 0.1 s
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=10)
    output = "".join(lines)
    assert process.returncode == 0, output
    assert 2 <= output.count("retry-cycle-database-error") <= 4, output
    assert output.count("retry-cycle-database-error") == output.count("is unreachable")
    assert "Traceback" not in output and "lock held" not in output


def test_max_duration_not_shorter_than_interval_is_warned_about():
    env = command_env(f"postgres://postgres@127.0.0.1:{closed_port()}/nr_nowhere", "nr_nowhere")
    process = subprocess.Popen(
        [sys.executable, "-m", "django", "retry_worker", "--interval", "5", "--max-duration", "10"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    warning = "--max-duration 10 is not shorter than --interval 5"
    seen: list[str] = []
    try:
        # Until the warning is printed (or the process ends), not a fixed sleep a loaded machine outruns.
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            if warning in line:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)
    stderr = "".join(seen) + rest
    assert warning in stderr
    once = run_command("--once", "--interval", "5", "--max-duration", "10", env=env)
    assert "not shorter than" not in once.stderr  # --once runs no next tick to delay


def test_version_is_the_apps():
    result = run_command("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == notifications_retry.__version__
    assert "exit status" in run_command("--help").stdout.lower()


@pytest.mark.django_db
def test_migrations_are_complete():
    call_command("makemigrations", "notifications_retry", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_the_commands_check_silences_w006_only_while_it_runs(settings: Any) -> None:
    """W006 is silenced during the command's own checks, and the project's list is back afterwards, even
    when a check raises."""
    from notifications_retry.management.commands.retry_worker import Command

    settings.SILENCED_SYSTEM_CHECKS = ["admin.E001"]
    seen: list[list[str]] = []

    def observe(app_configs: Any, **kwargs: Any) -> list[Any]:
        seen.append(list(settings.SILENCED_SYSTEM_CHECKS))
        raise RuntimeError("a check that fails")

    registry.register(observe)
    try:
        with pytest.raises(RuntimeError, match="a check that fails"):
            Command().check()
    finally:
        registry.registered_checks.discard(observe)
    assert seen == [["admin.E001", "notifications_retry.W006"]]
    assert settings.SILENCED_SYSTEM_CHECKS == ["admin.E001"]
