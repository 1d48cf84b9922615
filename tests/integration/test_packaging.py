"""The built distributions: a clean venv installs the wheel and runs the example project's checks.

Builds the sdist, then the wheel from that sdist (as ``python -m build`` does, so a file missing from
the sdist fails here), installs the wheel into a fresh venv and runs ``manage.py check`` and
``migrate`` of a copy of the example project against it, away from the source tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import uuid
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # Build from a copy so no build/ or *.egg-info lands in the shared working tree.
    src = tmp_path_factory.mktemp("src") / "project"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".venv",
            ".tox",
            ".git",
            ".pgdata",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".mypy_cache",
            ".ruff_cache",
            "node_modules",
        ),
    )
    run(sys.executable, "-m", "build", "--outdir", out, src, cwd=src)
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env_dir = tmp_path_factory.mktemp("venv") / "env"
    # A venv with nothing in it, not even pip: this interpreter's pip installs into it (``--python``),
    # which saves bootstrapping a second pip; byte-compiling is left to the first imports.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    (wheel,) = dist.glob("*.whl")
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-compile",
        wheel,
        "dj-database-url",
        "psycopg[binary]",
        cwd=env_dir,
    )
    return python


@pytest.fixture
def scratch_database() -> Iterator[str]:
    base = settings.DATABASES["default"]
    name = f"nr_pkg_{uuid.uuid4().hex[:10]}"
    params = {
        "host": base["HOST"] or None,
        "port": base["PORT"] or None,
        "user": base["USER"] or None,
        "password": base["PASSWORD"] or None,
        "dbname": "postgres",
        "autocommit": True,
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v is not None}) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    user = base["USER"] or "postgres"
    password = f":{base['PASSWORD']}" if base["PASSWORD"] else ""
    yield f"postgres://{user}{password}@{base['HOST'] or '127.0.0.1'}:{base['PORT'] or 5432}/{name}"
    with psycopg.connect(**{k: v for k, v in params.items() if v is not None}) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_wheel_holds_the_package_data(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "notifications_retry/py.typed" in names
    assert "notifications_retry/migrations/0001_initial.py" in names
    assert "notifications_retry/management/commands/retry_worker.py" in names
    assert not [n for n in names if n.startswith(("tests/", "example_project/"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "Requires-Python: >=3.11" in text
    assert "Classifier: Framework :: Django :: 4.2" in text
    for source in (ROOT / "notifications_retry").rglob("*"):
        relative = source.relative_to(ROOT).as_posix()
        if (
            source.is_file()
            and "__pycache__" not in relative
            and source.suffix in {".py", ".json", ".html", ".css", ".js", ".typed"}
        ):
            assert relative in names, f"{relative} is missing from the wheel"


def test_sdist_holds_the_readme_and_changelog(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"README.md", "pyproject.toml", "CHANGELOG.md"} <= names


def test_clean_venv_runs_the_example_project(installed: Path, scratch_database: str, tmp_path: Path) -> None:
    # A copy of the example project only: `notifications_retry` must come from the installed wheel.
    shutil.copytree(
        ROOT / "example_project", tmp_path / "example_project", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "manage.py", tmp_path / "manage.py")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "DATABASE_URL": scratch_database,
        "HOME": str(tmp_path),
        "DJANGO_DEBUG": "0",
    }
    where = run(
        installed,
        "-c",
        "import notifications_retry; print(notifications_retry.__file__)",
        cwd=tmp_path,
        env=env,
    )
    assert "site-packages" in where, where
    run(installed, "manage.py", "check", "--fail-level", "WARNING", cwd=tmp_path, env=env)
    run(installed, "manage.py", "migrate", "--noinput", cwd=tmp_path, env=env)
    run(
        installed,
        "manage.py",
        "makemigrations",
        "--check",
        "--dry-run",
        "notifications_retry",
        cwd=tmp_path,
        env=env,
    )
    run(
        installed,
        "manage.py",
        "check",
        "--database",
        "default",
        "--fail-level",
        "WARNING",
        cwd=tmp_path,
        env=env,
    )
    output = run(installed, "manage.py", "retry_worker", "--once", cwd=tmp_path, env=env, timeout=120)
    assert "Traceback" not in output


def test_demo_command_against_database_url(scratch_database: str) -> None:
    # `make demo` with DATABASE_URL set: the same command the README gives, on a throwaway database.
    env = {
        **os.environ,
        "DATABASE_URL": scratch_database,
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
    with psycopg.connect(scratch_database) as conn:
        counts = conn.execute(
            "SELECT attempts, jsonb_array_length(attempt_log) FROM notifications_retry_notificationentity"
        ).fetchall()
    assert counts and all(attempts == logged for attempts, logged in counts), counts
