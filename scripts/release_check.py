"""``make release-check``: build a release of django-notifications-retry, install it and send with it.

Run from a checkout, with the project's development environment (``build`` and ``twine``, the ``dev``
extra) and a PostgreSQL server (``DATABASE_URL``, by default the local one):

1. the versions agree: ``notifications_retry.__version__``, CHANGELOG.md's top release
   (``## [X.Y.Z] - YYYY-MM-DD``) and the newest row of docs/upgrading.md's release table, whose last
   migration must be the newest file of ``notifications_retry/migrations/`` (a schema change takes a
   new version);
2. ``python -m build`` makes the sdist and, from it, the wheel (from a copy of the checkout, so no
   ``build/`` or ``*.egg-info`` lands in it), into ``dist/``; the wheel's version is the others', it
   holds every file of the package and nothing else, and ``twine check`` passes on both;
3. a fresh virtualenv installs the wheel (no source tree on its path) and, against a throwaway database
   of the server, runs the example project's ``check``, ``migrate``, ``retry_worker --version``, then
   creates a webhook channel and one notification through the API and sends it with
   ``retry_worker --once`` to an HTTP receiver on 127.0.0.1: the receiver gets it once, the row is Sent.

Exits 0 when every step passed, 1 at the first that failed (saying which), 2 on bad options. The
versions alone (no build, no database): ``--versions-only``. ``tests/unit/test_release.py`` runs the
same version checks in the default suite.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
import uuid
import venv
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DISTRIBUTION = "django-notifications-retry"
#: A release heading of CHANGELOG.md (Keep a Changelog): ``## [0.2.0] - 2026-12-07``.
RELEASE_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?P<rest>.*)$", re.M)
RELEASE_DATED = re.compile(r"^ - (?P<date>\d{4}-\d{2}-\d{2})$")
VERSION = re.compile(r"^\d+\.\d+\.\d+$")
#: A row of docs/upgrading.md's release table: ``| 0.2.0 | 2026-12-07 | `0023_name` |``.
TABLE_ROW = re.compile(
    r"^\| (?P<version>[^|\s]+) \| (?P<date>[^|\s]+) \| `(?P<migration>\d{4}_\w+)` \|$", re.M
)
TABLE_SECTION = "## Releases and their schema"
MIGRATION_FILE = re.compile(r"^(\d{4})_\w+\.py$")
#: The wheel holds these files of the package (besides every module): data the app reads at run time.
PACKAGE_SUFFIXES = {".py", ".json", ".html", ".css", ".js", ".typed"}
#: What a copy of the checkout leaves out before building.
NOT_BUILT = (".venv*", ".tox", ".git", ".pgdata", "build", "dist", "*.egg-info", "__pycache__", ".mypy_cache")


class ReleaseCheckFailed(Exception):
    """One step failed: the message says which and why."""


@dataclass(frozen=True)
class Release:
    version: str
    date: str
    migration: str = ""


# --- The versions (no build, no database) -----------------------------------------------------------


def package_version(root: Path) -> str:
    """``__version__`` as notifications_retry/version.py assigns it (read, not imported)."""
    tree = ast.parse((root / "notifications_retry" / "version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise ReleaseCheckFailed("notifications_retry/version.py assigns no __version__ string")


def changelog_releases(text: str) -> list[Release]:
    """CHANGELOG.md's releases, newest first; ``Unreleased`` is left out, a release without a date is an
    error (Keep a Changelog: ``## [X.Y.Z] - YYYY-MM-DD``)."""
    releases = []
    for match in RELEASE_HEADING.finditer(text):
        version, rest = match["version"], match["rest"]
        if version == "Unreleased":
            continue
        dated = RELEASE_DATED.match(rest)
        if not VERSION.match(version) or dated is None:
            raise ReleaseCheckFailed(
                f"CHANGELOG.md: {match[0]!r} is not a release heading of the form '## [X.Y.Z] - YYYY-MM-DD'"
            )
        releases.append(Release(version, dated["date"]))
    if not releases:
        raise ReleaseCheckFailed("CHANGELOG.md has no release heading ('## [X.Y.Z] - YYYY-MM-DD')")
    return releases


def release_table(text: str) -> list[Release]:
    """docs/upgrading.md's table of releases and their last migrations, in its order (newest first)."""
    if TABLE_SECTION not in text:
        raise ReleaseCheckFailed(f"docs/upgrading.md has no '{TABLE_SECTION}' section")
    section = text.split(TABLE_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [Release(m["version"], m["date"], m["migration"]) for m in TABLE_ROW.finditer(section)]
    if not rows:
        raise ReleaseCheckFailed("docs/upgrading.md's release table has no row")
    return rows


def migrations(root: Path) -> list[str]:
    """The app's migrations, oldest first (names without ``.py``)."""
    directory = root / "notifications_retry" / "migrations"
    return sorted(p.stem for p in directory.iterdir() if MIGRATION_FILE.match(p.name))


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def version_problems(root: Path) -> list[str]:
    """What disagrees between the version, CHANGELOG.md, docs/upgrading.md and the migrations."""
    problems: list[str] = []
    try:
        version = package_version(root)
        changelog = changelog_releases((root / "CHANGELOG.md").read_text())
        table = release_table((root / "docs" / "upgrading.md").read_text())
    except ReleaseCheckFailed as exc:
        return [str(exc)]
    top, newest_row = changelog[0], table[0]
    if top.version != version:
        problems.append(f"CHANGELOG.md's top release is {top.version}, __version__ is {version}")
    if newest_row.version != version:
        problems.append(
            f"docs/upgrading.md's newest release is {newest_row.version}, __version__ is {version}"
        )
    dates = {r.version: r.date for r in changelog}
    for row in table:
        if row.version not in dates:
            problems.append(
                f"docs/upgrading.md names release {row.version}, which CHANGELOG.md has no section for"
            )
        elif dates[row.version] != row.date:
            problems.append(
                f"release {row.version} is dated {dates[row.version]} in CHANGELOG.md, "
                f"{row.date} in docs/upgrading.md"
            )
    if [_key(r.version) for r in changelog] != sorted((_key(r.version) for r in changelog), reverse=True):
        problems.append("CHANGELOG.md's releases are not newest first")
    if [_key(r.version) for r in table] != sorted({_key(r.version) for r in table}, reverse=True):
        problems.append("docs/upgrading.md's release table is not newest first, one row per release")
    names = migrations(root)
    for row in table:
        if row.migration not in names:
            problems.append(
                f"docs/upgrading.md: release {row.version}'s last migration {row.migration} does not exist"
            )
    if [r.migration for r in table] != sorted((r.migration for r in table), reverse=True):
        problems.append("docs/upgrading.md: a release's last migration is older than an earlier release's")
    if names and newest_row.migration != names[-1]:
        problems.append(
            f"the newest migration is {names[-1]}, but release {newest_row.version}'s last one is "
            f"{newest_row.migration}: a schema change takes a new version (a row in docs/upgrading.md's "
            "release table, a section in CHANGELOG.md, notifications_retry/version.py)"
        )
    return problems


# --- The built distributions --------------------------------------------------------------------------


def run(
    args: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> str:
    result = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        command = " ".join(str(a) for a in args)
        raise ReleaseCheckFailed(
            f"{command} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result.stdout


def build(root: Path, out: Path, scratch: Path) -> tuple[Path, Path]:
    """The sdist, then the wheel built from it (``python -m build``), into ``out``."""
    source = scratch / "source"
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(*NOT_BUILT))
    if out.exists():
        shutil.rmtree(out)
    run([sys.executable, "-m", "build", "--outdir", out, source], cwd=source)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise ReleaseCheckFailed(f"expected one wheel and one sdist in {out}, found {wheels + sdists}")
    return wheels[0], sdists[0]


def wheel_version(wheel: Path) -> str:
    """The version the wheel's METADATA gives (its file name must say the same)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    match = re.search(r"^Version: (\S+)$", metadata, re.M)
    if match is None:
        raise ReleaseCheckFailed(f"{wheel.name}'s METADATA has no Version")
    if f"-{match[1]}-" not in wheel.name:
        raise ReleaseCheckFailed(f"{wheel.name} is named for another version than its METADATA's {match[1]}")
    return match[1]


def distribution_problems(root: Path, wheel: Path, sdist: Path) -> list[str]:
    """What the built files hold that they should not, or lack."""
    problems = []
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    requires = tomllib.loads((root / "pyproject.toml").read_text())["project"]["requires-python"]
    if f"Requires-Python: {requires}" not in metadata:
        problems.append(f"the wheel's METADATA lacks 'Requires-Python: {requires}'")
    for source in sorted((root / "notifications_retry").rglob("*")):
        relative = source.relative_to(root).as_posix()
        packaged = source.is_file() and "__pycache__" not in relative and source.suffix in PACKAGE_SUFFIXES
        if packaged and relative not in names:
            problems.append(f"{relative} is missing from the wheel")
    strays = sorted(n for n in names if n.startswith(("tests/", "example_project/", "bench/", "scripts/")))
    if strays:
        problems.append(f"the wheel holds files outside the package: {strays[:5]}")
    with tarfile.open(sdist) as archive:
        members = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    for needed in ("README.md", "CHANGELOG.md", "LICENSE", "pyproject.toml"):
        if needed not in members:
            problems.append(f"the sdist lacks {needed}")
    return problems


# --- The installed wheel, on PostgreSQL ---------------------------------------------------------------


def install(wheel: Path, env_dir: Path) -> Path:
    """A virtualenv with the wheel and what the example project adds (dj-database-url, psycopg's binary)."""
    # No pip inside: this interpreter's pip installs into it (--python), which saves bootstrapping one.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            wheel,
            "dj-database-url",
            "psycopg[binary]",
        ],
        cwd=env_dir,
    )
    return python


@contextlib.contextmanager
def throwaway_database(server_url: str, name_prefix: str) -> Iterator[str]:
    """An empty database on the server of ``server_url``, dropped afterwards; yields its URL."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    name = f"{name_prefix}{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(server_url)
    user = params.get("user") or "postgres"
    password = f":{params['password']}" if params.get("password") else ""
    host, port = params.get("host") or "127.0.0.1", params.get("port") or "5432"
    try:
        yield f"postgres://{user}{password}@{host}:{port}/{name}"
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Receiver(http.server.ThreadingHTTPServer):
    """An HTTP receiver on 127.0.0.1 (a free port) that answers 200 and keeps each POST's headers."""

    def __init__(self) -> None:
        self.posts: list[dict[str, str]] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.posts.append({k.lower(): v for k, v in self.headers.items()})
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


# A notification scheduled for now: the worker's to send (a fresh one is the monolith dispatcher's).
CREATE_ONE = """
from django.utils import timezone
from notifications_retry import schedule_notification
from notifications_retry.models import ChannelConfig
ChannelConfig.objects.create(key="release-hook", provider_key="webhook", options={"url": URL})
row = schedule_notification(
    channel="release-hook", recipient="release-check", send_at=timezone.now(), payload={"check": "release"}
)
print("NOTIFICATION", row.pk)
"""

SHOW_ROW = """
from notifications_retry.models import NotificationEntity, Outbox
row = NotificationEntity.objects.get(pk=PK)
print("ROW", row.status, row.attempts, Outbox.objects.filter(key=str(row.pk)).count())
"""


def send_with_the_installed_wheel(python: Path, version: str, database_url: str, scratch: Path) -> str:
    """The example project (copied, away from the source tree) on the installed wheel: returns a summary."""
    project = scratch / "project"
    shutil.copytree(
        ROOT / "example_project", project / "example_project", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "manage.py", project / "manage.py")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(scratch),
        "DATABASE_URL": database_url,
        "DJANGO_DEBUG": "0",
        "NOTIFICATIONS_RETRY_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "LOG_FORMAT": "json",
    }
    where = run(
        [python, "-c", "import notifications_retry as n; print(n.__version__, n.__file__)"],
        cwd=project,
        env=env,
    )
    installed_version, location = where.split()
    if installed_version != version or "site-packages" not in location:
        raise ReleaseCheckFailed(
            f"the virtualenv imports notifications_retry {installed_version} from {location}"
        )
    said = run([python, "manage.py", "retry_worker", "--version"], cwd=project, env=env).strip()
    if said != version:
        raise ReleaseCheckFailed(f"retry_worker --version says {said!r}, the release is {version}")
    run([python, "manage.py", "check", "--fail-level", "WARNING"], cwd=project, env=env)
    run([python, "manage.py", "migrate", "--noinput"], cwd=project, env=env)
    run(
        [python, "manage.py", "makemigrations", "--check", "--dry-run", "notifications_retry"],
        cwd=project,
        env=env,
    )
    receiver = Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
        created = run(
            [python, "manage.py", "shell", "-c", CREATE_ONE.replace("URL", repr(url))], cwd=project, env=env
        )
        pk = created.split("NOTIFICATION", 1)[1].split()[0]
        run(
            [python, "manage.py", "check", "--database", "default", "--fail-level", "WARNING"],
            cwd=project,
            env=env,
        )
        worker = subprocess.run(
            [str(python), "manage.py", "retry_worker", "--once"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        receiver.shutdown()
        receiver.server_close()
    keys = [post.get("idempotency-key") for post in receiver.posts]
    if worker.returncode != 0 or keys != [pk]:
        raise ReleaseCheckFailed(
            f"retry_worker --once exited {worker.returncode}, the receiver got {len(keys)} POSTs "
            f"(Idempotency-Key {keys}), expected one for {pk}:\n"
            f"{worker.stdout[-3000:]}\n{worker.stderr[-3000:]}"
        )
    shown = run([python, "manage.py", "shell", "-c", SHOW_ROW.replace("PK", repr(pk))], cwd=project, env=env)
    status, attempts, events = shown.split("ROW", 1)[1].split()
    if (status, attempts, events) != ("sent", "1", "1"):
        raise ReleaseCheckFailed(
            f"after the send the row is {status} with {attempts} attempts and {events} events"
        )
    return f"notification {pk} sent once to 127.0.0.1, row Sent after 1 attempt, 1 outbox event"


# --- The command ----------------------------------------------------------------------------------------


def say(message: str) -> None:
    print(f"release-check: {message}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release_check", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="The checkout to check (default: this one).")
    parser.add_argument(
        "--dist", type=Path, default=None, help="Where the sdist and wheel go (default: ROOT/dist)."
    )
    parser.add_argument(
        "--versions-only", action="store_true", help="Only the version checks (no build, no database)."
    )
    parser.add_argument(
        "--database-prefix",
        default="nr_release_",
        help="Name prefix of the throwaway database (default nr_release_); the server is DATABASE_URL's.",
    )
    options = parser.parse_args(argv)
    root: Path = options.root.resolve()
    started = time.monotonic()
    try:
        problems = version_problems(root)
        if problems:
            raise ReleaseCheckFailed("the versions disagree:\n  " + "\n  ".join(problems))
        version = package_version(root)
        say(f"version {version}: __version__, CHANGELOG.md, docs/upgrading.md and the migrations agree")
        if options.versions_only:
            return 0
        with tempfile.TemporaryDirectory(prefix="nr-release-") as tmp:
            scratch = Path(tmp)
            wheel, sdist = build(root, (options.dist or root / "dist").resolve(), scratch)
            built = wheel_version(wheel)
            if built != version or f"-{version}.tar.gz" not in sdist.name:
                raise ReleaseCheckFailed(f"built {wheel.name} and {sdist.name}, __version__ is {version}")
            problems = distribution_problems(root, wheel, sdist)
            if problems:
                raise ReleaseCheckFailed("the distributions:\n  " + "\n  ".join(problems))
            say(f"built {sdist.name} and {wheel.name}")
            run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel], cwd=root)
            say("twine check passed")
            python = install(wheel, scratch / "venv")
            say(f"installed {wheel.name} into a fresh virtualenv")
            server = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
            with throwaway_database(server, options.database_prefix) as database_url:
                summary = send_with_the_installed_wheel(python, version, database_url, scratch)
            say(f"check, migrate, retry_worker --version passed; {summary}")
    except ReleaseCheckFailed as exc:
        say(f"FAILED: {exc}")
        return 1
    say(f"release {version} passed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
