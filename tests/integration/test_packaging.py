"""A release as a user installs it, and the demo on a server's database.

``scripts/release_check.py`` (``make release-check``) builds the sdist and, from it, the wheel, checks
what they hold and runs ``twine check``, installs the wheel into a fresh virtualenv and, away from the
source tree, runs the example project's ``check`` and ``migrate`` and sends one notification with
``retry_worker --once`` to a receiver on 127.0.0.1, on a throwaway database of the test server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

from tests.support.databases import database_name, scratch_database

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


def server_url() -> str:
    base = settings.DATABASES["default"]
    user = base["USER"] or "postgres"
    password = f":{base['PASSWORD']}" if base["PASSWORD"] else ""
    return f"postgres://{user}{password}@{base['HOST'] or '127.0.0.1'}:{base['PORT'] or 5432}/postgres"


def test_the_release_check_builds_installs_and_sends(tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": server_url()}
    prefix = database_name(f"nr_release_{uuid.uuid4().hex[:6]}_")  # this test's own: nothing else makes it
    output = run(
        sys.executable,
        ROOT / "scripts" / "release_check.py",
        "--dist",
        tmp_path / "dist",
        "--database-prefix",
        prefix,
        cwd=ROOT,
        env=env,
        timeout=560,
    )
    assert "twine check passed" in output
    assert "sent once to 127.0.0.1, row Sent after 1 attempt, 1 outbox event" in output
    assert {p.suffix for p in (tmp_path / "dist").iterdir()} == {".whl", ".gz"}
    with psycopg.connect(server_url(), autocommit=True) as conn:
        left = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", [prefix + "%"]
        ).fetchall()
    assert left == []  # the throwaway database is dropped


def test_demo_command_against_database_url() -> None:
    # `make demo` with DATABASE_URL set: the same command the README gives, on a throwaway database.
    with scratch_database("nr_pkg") as scratch:
        demo_on(scratch.url)


def demo_on(database_url: str) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
    }
    output = run(sys.executable, "manage.py", "demo", cwd=ROOT, env=env, timeout=120)
    rows = {line.split("  ")[0]: line for line in output.splitlines()}
    assert "processed=4, sent=2, retried=1, terminal=1, channel_disabled=1" in output
    assert "Sent" in rows["failed in_app, retry due"]
    assert "failed (dead letter)" in rows["failed email, last attempt"]
    fresh = rows["fresh in_app (dispatcher's)"]
    assert fresh.count("pending (fresh)") == 2 and "Sent" not in fresh
    # The admin shows these rows: each one's attempt count and its history agree (one entry per attempt).
    with psycopg.connect(database_url) as conn:
        counts = conn.execute(
            "SELECT attempts, jsonb_array_length(attempt_log) FROM notifications_retry_notificationentity"
        ).fetchall()
    assert counts and all(attempts == logged for attempts, logged in counts), counts
