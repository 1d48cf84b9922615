"""The example project's web ``/metrics``, scraped through the real development server.

It carries django-prometheus's request metrics (the middleware is wired) and the queue-health gauges,
read from the database at the scrape (``notifications_retry.observability.queue_health``), and none of
the worker's counters or tick metrics: those stay on the worker's port (docs/observability.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from notifications_retry.models import NotificationEntity
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.databases import closed_port
from tests.support.processes import stop_with

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def scrape(port: int, process: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60
    while True:
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            break
        except httpx.TransportError:
            assert process.poll() is None, "the development server exited"
            assert time.monotonic() < deadline, "the development server did not answer in 60 s"
            time.sleep(0.2)
    assert response.status_code == 200, response.text
    return response.text


def test_the_example_project_s_metrics_carry_the_queue_health_gauges_and_no_worker_series() -> None:
    channel = ChannelFactory(key="email")
    now = timezone.now()
    for _ in range(3):
        NotificationFactory(
            channel=channel,
            status=NotificationEntity.Status.FAILED,
            attempts=1,
            next_attempt_at=now - timedelta(minutes=10),
        )
    database = connection.settings_dict
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "NR_"))},
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DATABASE_URL": f"postgres://{database['USER'] or 'postgres'}"
        + (f":{database['PASSWORD']}" if database["PASSWORD"] else "")
        + f"@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/{database['NAME']}",
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",  # stop_with: a server that hangs prints its threads
    }
    port = closed_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        scrape(port, server)  # a first request: the middleware's counters then show one
        text = scrape(port, server)
    finally:
        # SIGTERM ends the development server at once (it has no handler for it): how it stops on
        # Ctrl-C is test_demo's. stop_with ends a server that stays, which would otherwise hold up the
        # test database's teardown with its connection.
        output = stop_with(server, signal.SIGTERM, timeout=30)
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }
    assert values["notifications_failed_backlog_gauge"] == 3.0, output
    assert values["notifications_retry_due_backlog"] == 3.0
    assert 600 <= values["notifications_retry_oldest_due_age_seconds"] < 900
    assert values["notifications_retry_dead_letters_unresolved"] == 0.0
    assert values["notifications_retry_queue_health_up"] == 1.0
    assert values["django_http_requests_before_middlewares_total"] >= 1.0  # the middleware is wired
    names = {family.name for family in text_string_to_metric_families(text)}
    worker_only = {
        "notifications_retry_processed",
        "notifications_retry_sent",
        "notifications_retry_lock_held",
    }
    assert not names & worker_only, sorted(names)
