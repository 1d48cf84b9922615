"""A real ``retry_worker --metrics-port`` process: scrape its /metrics over 127.0.0.1 after a tick."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.http_server import Reply, ScriptedServer

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[2]
Status = NotificationEntity.Status


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_env(settings: dict[str, object] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "NR_TEST_DATABASE_NAME": connection.settings_dict["NAME"],
            "DATABASE_URL": os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "NR_TEST_SETTINGS_JSON": json.dumps(settings or {}),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run_command(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "retry_worker", *args],
        cwd=REPO_ROOT,
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer(lambda request: Reply(500, {"error": "down"})).start()
    yield scripted
    scripted.stop()


def test_worker_serves_metrics_with_the_values_of_its_tick(server, tmp_path):
    past = timezone.now() - timedelta(minutes=5)
    in_app = ChannelFactory(key="in_app")
    email = ChannelFactory(key="email", provider_key="stub", options={"fail": "permanent"})
    sms = ChannelFactory(key="sms", provider_key="stub", options={"fail": "retriable"}, max_attempts=5)
    push = ChannelFactory(key="push", provider_key="stub", is_enabled=False)
    hook = ChannelFactory(
        key="webhook", provider_key="webhook", options={"url": server.url}, max_attempts=9, max_concurrency=1
    )
    for channel, count in ((in_app, 3), (email, 2), (sms, 1), (push, 4), (hook, 6)):
        for _ in range(count):
            NotificationFactory(channel=channel, status=Status.FAILED, attempts=1, next_attempt_at=past)

    port = free_port()
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        # A long interval: exactly one tick happens while the test looks.
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "retry_worker", "--interval", "600", "--metrics-port", str(port)],
            cwd=REPO_ROOT,
            env=worker_env(
                {"CIRCUIT_BREAKER": {"failure_threshold": 3}, "WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        samples: dict = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            try:
                samples = scrape(port)
            except (urllib.error.URLError, ConnectionError):
                samples = {}
            if value(samples, "notifications_retry_last_tick_completed_timestamp_seconds", lane="default"):
                break
            time.sleep(0.2)
        else:
            pytest.fail("no completed tick seen on /metrics:\n" + log_path.read_text())

        calls = len(server.requests)
        # The circuit opened after its failure_threshold consecutive 500s (a record already queued
        # behind them may still go out): not every webhook row was tried.
        assert 3 <= calls < 6
        assert value(samples, "notifications_retry_sent_total", channel="in_app") == 3
        assert value(samples, "notifications_retry_processed_total", channel="in_app", outcome="sent") == 3
        assert (
            value(
                samples,
                "notifications_retry_terminal_failed_total",
                channel="email",
                error_kind="stub_permanent",
            )
            == 2
        )
        assert value(samples, "notifications_retry_processed_total", channel="email", outcome="terminal") == 2
        assert (
            value(samples, "notifications_retry_retried_total", channel="sms", error_kind="stub_retriable")
            == 1
        )
        assert (
            value(samples, "notifications_retry_retried_total", channel="webhook", error_kind="http_5xx")
            == calls
        )
        assert value(samples, "notifications_retry_channel_disabled_total", channel="push") == 4
        assert value(samples, "notifications_retry_circuit_state", channel="webhook") == 2
        assert value(samples, "notifications_retry_circuit_state", channel="in_app") == 0
        # Backlog after the tick: 1 sms and 6 webhook rows (retried or left behind the open circuit) wait,
        # and the disabled channel's 4; the 2 dead letters are not backlog.
        assert value(samples, "notifications_failed_backlog_gauge") == 1 + 6 + 4
        assert value(samples, "notifications_retry_lock_held", lane="default") == 0
        assert value(samples, "notifications_retry_cycle_duration_ms_count", lane="default") == 1
        last = value(samples, "notifications_retry_last_cycle_duration_ms", lane="default")
        assert last is not None and last > 0
        assert value(samples, "notifications_retry_oldest_due_age_seconds") >= 290
        completed = value(
            samples, "notifications_retry_last_tick_completed_timestamp_seconds", lane="default"
        )
        started = value(samples, "notifications_retry_last_tick_started_timestamp_seconds", lane="default")
        assert started <= completed <= time.time()
        # The process's own CPU, which tells a worker its one thread bounds (docs/operations.md).
        cpu = value(samples, "process_cpu_seconds_total")
        assert cpu is not None and cpu > 0
        # Never an id in a label: cardinality stays bounded by channels, outcomes and error kinds.
        label_values = {v for (_, labels) in samples for (_, v) in labels}
        ids = {str(n.id) for n in NotificationEntity.objects.all()} | {
            str(n.tenant_id) for n in NotificationEntity.objects.all()
        }
        assert not label_values & ids

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_metrics_port_in_use_exits_2_with_a_clear_message():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_command("--once", "--metrics-port", str(port))
    assert result.returncode == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-port", "70000"], "must be a port number 0-65535"),
        (["--metrics-port", "http"], "expected a port number"),
        (["--metrics-port", "9000", "--metrics-addr", "localhost:9"], "expected an IP address"),
    ],
)
def test_bad_metrics_options_exit_2(args, message):
    result = run_command("--once", *args)
    assert result.returncode == 2
    assert message in result.stderr
