"""Fixtures of the fault suite: worker subprocesses on the test database, seeding by SQL, --soak."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from notifications_retry.models import ChannelConfig
from tests.support.opt_in import skip_unless_asked
from tests.support.processes import WorkerProcess, worker_env

SOAK_ENV = "NR_SOAK"

INSERT_DUE = """
INSERT INTO notifications_retry_notificationentity (
    id, tenant_id, recipient, payload, notification_type, priority, status, attempts, next_attempt_at,
    last_error, error_kind, attempt_log, dead_letter_reason, resolution, requeue_count, correlation_id,
    created_at, updated_at, channel_id)
SELECT gen_random_uuid(), NULL, 'user' || g || '@example.com', jsonb_build_object('n', g, 'subject', 'Hello'),
       '', 5, 'failed', %(attempts)s, now() - interval '1 minute' + g * interval '1 microsecond', '',
       'seed', '[]', '', '', 0, '', now(), now(), %(channel)s
FROM generate_series(1, %(count)s) g
"""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak",
        action="store_true",
        default=False,
        help="Also run the long soak scenarios (@pytest.mark.soak); or set NR_SOAK=1.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_asked(
        config,
        items,
        marker="soak",
        option="--soak",
        env=SOAK_ENV,
        reason="soak scenario: run with --soak or NR_SOAK=1 (make soak)",
    )


def seed_due(channel: ChannelConfig, count: int, *, attempts: int = 1) -> None:
    """Insert ``count`` Failed rows of ``channel``, due now, oldest first by insertion order."""
    with connection.cursor() as cursor:
        cursor.execute(INSERT_DUE, {"channel": channel.pk, "count": count, "attempts": attempts})


StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def start_worker(transactional_db: None, tmp_path: Path) -> Iterator[StartWorker]:
    """Start ``retry_worker`` subprocesses on this run's test database; all are killed at teardown."""
    started: list[WorkerProcess] = []
    database_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")

    def start(
        args: Sequence[str] = (),
        settings: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "worker",
        url: str | None = None,
        database: str | None = None,
    ) -> WorkerProcess:
        merged = {"LEASE_GRACE_SECONDS": 0.5, **(settings or {})}
        process = WorkerProcess(
            args,
            worker_env(url or database_url, database or connection.settings_dict["NAME"], merged, env),
            tmp_path,
            name,
        ).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
