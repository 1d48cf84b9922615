"""The README's install section, pasted into a new ``django-admin startproject`` against PostgreSQL.

Every fenced block of "Install into an existing project" and "Configuration" carries a
``<!-- snippet: TARGET -->`` tag saying where it goes; this test puts each one there, in order:
``settings.py`` / ``urls.py`` are appended to the project's files, ``shell`` lines run in bash in the
project directory, ``manage.py shell`` blocks run through ``manage.py shell -c``. Only ``pip`` is not
run (the package under test is this checkout, put on ``PYTHONPATH``). Run it alone with ``-m readme``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.databases import ScratchDatabase, scratch_database

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTIONS = ("## Install into an existing project", "## Configuration")
TAGGED_BLOCK = re.compile(
    r"^[ ]*<!-- snippet: (?P<target>[^>]+?) -->\n[ ]*```(?P<lang>\w+)\n(?P<body>.*?)^[ ]*```$",
    re.M | re.S,
)
TARGETS = {"pip", "settings.py", "urls.py", "shell", "manage.py shell"}

pytestmark = [pytest.mark.readme, pytest.mark.timeout(240)]


def section(heading: str) -> str:
    start = README.index(heading + "\n")
    end = README.find("\n## ", start + len(heading))
    return README[start : end if end != -1 else len(README)]


def snippets() -> list[tuple[str, str]]:
    """(target, code) of every tagged block of the install and configuration sections, in order."""
    found = []
    for heading in SECTIONS:
        for match in TAGGED_BLOCK.finditer(section(heading)):
            lines = match["body"].splitlines()
            indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
            found.append((match["target"], "\n".join(line[indent:] for line in lines) + "\n"))
    return found


def test_every_block_of_the_install_and_configuration_sections_is_tagged_and_run_here():
    for heading in SECTIONS:
        text = section(heading)
        fences = re.findall(r"^[ ]*```\w+$", text, re.M)
        assert fences, heading
        assert len(fences) == len(TAGGED_BLOCK.findall(text)), f"an untagged code block under {heading!r}"
    assert {target for target, _ in snippets()} <= TARGETS
    (pip,) = [code for target, code in snippets() if target == "pip"]
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert pip.split() == ["pip", "install", name, '"psycopg[binary]"']
    settings = "".join(code for target, code in snippets() if target == "settings.py")
    assert '"ENGINE": "django.db.backends.postgresql"' in settings


class Project:
    """A fresh startproject whose processes import this checkout and use a scratch database."""

    def __init__(self, directory: Path, database: ScratchDatabase) -> None:
        self.dir = directory
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "NR_", "POSTGRES_")) and k != "DATABASE_URL"
        }
        env.update(
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            PYTHONPATH=str(ROOT),
            PYTHONUNBUFFERED="1",
            POSTGRES_DB=database.name,
            POSTGRES_USER=database.user,
            POSTGRES_PASSWORD=database.password,
            POSTGRES_HOST=database.host,
            POSTGRES_PORT=database.port,
        )
        self.env = env
        self.outputs: list[str] = []

    def run(self, command: str, timeout: float = 120) -> str:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"{command!r} exited {result.returncode}:\n{output}"
        self.outputs.append(output)
        return output

    def python(self, code: str) -> str:
        return self.run(f"python manage.py shell -c {shlex.quote(code)}")

    def loop_until_a_tick_completes(self, command: str) -> None:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.dir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        try:
            deadline = time.monotonic() + 60
            assert process.stdout is not None
            while time.monotonic() < deadline:
                line = process.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if "cycle-completed" in line:
                    break
        finally:
            process.send_signal(signal.SIGTERM)
            rest, _ = process.communicate(timeout=60)
        assert any("cycle-completed" in line for line in lines), "".join(lines) + rest
        assert process.returncode == 0, "".join(lines) + rest


def test_the_install_section_pastes_into_a_new_project(tmp_path: Path):
    with scratch_database("nr_readme") as database:
        project = Project(tmp_path / "myproject", database)
        project.dir.mkdir()
        project.run(f"{sys.executable} -m django startproject myproject .")
        for target, code in snippets():
            if target == "pip":
                continue
            if target in ("settings.py", "urls.py"):
                with (project.dir / "myproject" / target).open("a") as file:
                    file.write("\n\n" + code)
            elif target == "manage.py shell":
                project.python(code)
            else:
                for line in filter(None, (raw.split("#")[0].strip() for raw in code.splitlines())):
                    if line.endswith("retry_worker"):
                        project.loop_until_a_tick_completes(line)
                    else:
                        project.run(line)

        once = next(out for out in project.outputs if "retry-cycle-started" in out)
        assert "item-sent" in once and "processed=1" in once and "sent=1" in once, once
        assert "user-42" not in once  # the masking processors are in the chain
        rows = json.loads(
            project.python(
                "import json; from notifications_retry.models import NotificationEntity as N; "
                "print(json.dumps(sorted([str(n.status), n.scheduled_at is not None, str(n.tenant_id)] "
                "for n in N.objects.all())))"
            )
            .strip()
            .splitlines()[-1]
        )
        tenant = "0b7e8a54-52d5-4c4c-9d59-6f2f5a3b1c01"
        # The fresh one stays the dispatcher's; the handed-over ones are Failed (the worker's, later)
        # and Sent (recorded, and sent now); the scheduled one was sent by the worker's tick.
        assert rows == [
            ["failed", False, "None"],
            ["pending", False, tenant],
            ["sent", False, "None"],
            ["sent", False, "None"],
            ["sent", True, tenant],
        ]
        metrics = project.python(
            "from django.test import Client; r = Client(HTTP_HOST='localhost').get('/metrics'); "
            "print(r.status_code, r['Content-Type'].split(';')[0])"
        )
        assert metrics.strip().splitlines()[-1] == "200 text/plain"
        admin = project.python(
            "from django.contrib.auth.models import User; print(User.objects.count())"
        )  # the full migrate created the auth tables the admin needs
        assert admin.strip().splitlines()[-1] == "0"
        checked = project.run("python manage.py check --fail-level WARNING")
        assert "no issues" in checked
        conf = project.python(
            "from notifications_retry.conf import get_settings; print(get_settings().ATTEMPTS_BY_TYPE)"
        )
        assert "'marketing': 3" in conf
