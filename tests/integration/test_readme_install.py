"""The README's install section, pasted into a new ``django-admin startproject`` against PostgreSQL.

Every fenced block of "Install", "Configuration" and "Quickstart" carries a
``<!-- snippet: TARGET -->`` tag saying where it goes; this test puts each one there, in order:
``pip`` lines run in bash in the project directory of a fresh virtualenv, next to a copy of this
checkout named as the README's clone (``../notifications-retry``): the README's ``make -C … dist`` builds
the wheel there and its ``pip install --find-links`` line installs it, with its dependencies from the
package index, so a line that does not install fails here. Every later command runs in that virtualenv,
which imports the app from the installed wheel, never from this checkout. ``settings.py`` /
``urls.py`` are appended to the project's files, ``shell`` lines run in bash in the project directory,
``manage.py shell`` blocks run through ``manage.py shell -c``. Run it alone with ``-m readme``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from tests.support.checkout import copy_checkout, fresh_venv
from tests.support.databases import ScratchDatabase, scratch_database
from tests.support.http_server import ScriptedServer

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTIONS = ("## Install", "## Configuration", "## Quickstart")
TAGGED_BLOCK = re.compile(
    r"^[ ]*<!-- snippet: (?P<target>[^>]+?) -->\n[ ]*```(?P<lang>\w+)\n(?P<body>.*?)^[ ]*```$",
    re.M | re.S,
)
TARGETS = {"pip", "settings.py", "urls.py", "shell", "manage.py shell"}

pytestmark = [pytest.mark.readme, pytest.mark.timeout(900)]


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
    build, install = command_lines(pip)
    assert build == "make -C ../notifications-retry dist"
    assert install.split() == [
        "pip",
        "install",
        "--find-links",
        "../notifications-retry/dist",
        f'"{name}[anymail]"',
        '"psycopg[binary]"',
        "dj-database-url",
    ]
    # The command once published: the same line without --find-links.
    published = re.search(r"Once it is published[^:]*:\s+`([^`]+)`", section(SECTIONS[0]))
    assert published is not None
    assert published[1] == install.replace(" --find-links ../notifications-retry/dist", "")
    settings = "".join(code for target, code in snippets() if target == "settings.py")
    # The database comes from DATABASE_URL, as the example project and the Kubernetes manifests give it.
    assert 'os.environ["DATABASE_URL"]' in settings


def command_lines(code: str) -> list[str]:
    """The commands of a shell block, without comments and blank lines."""
    return [line for line in (raw.split("#")[0].strip() for raw in code.splitlines()) if line]


class Project:
    """A project directory whose commands run in a fresh virtualenv and use a scratch database."""

    def __init__(self, directory: Path, venv_bin: Path, database: ScratchDatabase) -> None:
        self.dir = directory
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "NR_", "POSTGRES_"))
            and k not in ("DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        }
        env.update(
            PATH=os.pathsep.join([str(venv_bin), env.get("PATH", "")]),
            VIRTUAL_ENV=str(venv_bin.parent),
            PYTHONUNBUFFERED="1",
            DATABASE_URL=database.url,
        )
        self.env = env
        self.outputs: list[str] = []

    def run(self, command: str, timeout: float = 300) -> str:
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
    copy_checkout(tmp_path / "notifications-retry")  # the README's clone, next to the project
    venv_bin = fresh_venv(tmp_path / "venv")
    with scratch_database("nr_readme") as database:
        project = Project(tmp_path / "myproject", venv_bin, database)
        project.dir.mkdir()
        for target, code in snippets():
            if target == "pip":
                for line in command_lines(code):
                    project.run(line, timeout=600)
                # Installed from the wheel into the virtualenv, extras and all: Django comes from there.
                where = project.run(
                    "python -c 'import anymail, notifications_retry; print(notifications_retry.__file__)'"
                )
                assert str(venv_bin.parent / "lib") in where and str(ROOT) not in where, where
                project.run("python -m django startproject myproject .")
            elif target in ("settings.py", "urls.py"):
                with (project.dir / "myproject" / target).open("a") as file:
                    file.write("\n\n" + code)
            elif target == "manage.py shell":
                project.python(code)
            else:
                for line in command_lines(code):
                    if line.endswith("retry_worker"):
                        project.loop_until_a_tick_completes(line)
                    else:
                        project.run(line)

        once = next(out for out in project.outputs if "retry-cycle-started" in out)
        # Piped, not a terminal: the README's settings write JSON lines.
        events = [json.loads(line) for line in once.splitlines() if line.startswith("{")]
        assert any(e["event"] == "item-sent" for e in events), once
        assert any(e["event"] == "cycle-completed" and e["processed"] == e["sent"] == 1 for e in events), once
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
        # The fresh one stays the dispatcher's; the handed-over ones are Failed (the worker's, later)
        # and Sent (recorded); the scheduled one was sent by the worker's tick.
        assert rows == [
            ["failed", False, "None"],
            ["pending", False, "None"],
            ["sent", False, "None"],
            ["sent", True, "None"],
        ]
        metrics = project.python(
            "from django.test import Client; r = Client(HTTP_HOST='localhost').get('/metrics'); "
            "print(r.status_code, r['Content-Type'].split(';')[0]); print(r.content.decode())"
        )
        assert "200 text/plain" in metrics.splitlines()
        # The queue-health gauges, read at the scrape: the one Failed row waits for its retry.
        assert "notifications_failed_backlog_gauge 1.0" in metrics.splitlines(), metrics
        assert "notifications_retry_queue_health_up 1.0" in metrics.splitlines(), metrics
        assert "django_http_requests_before_middlewares_total 1.0" in metrics.splitlines()  # the middleware
        admin = project.python(
            "from django.contrib.auth.models import User; print(User.objects.count())"
        )  # the full migrate created the auth tables the admin needs
        assert admin.strip().splitlines()[-1] == "0"
        checked = project.run("python manage.py check --fail-level WARNING")
        assert "no issues" in checked
        conf = project.python(
            "from notifications_retry.conf import get_settings; s = get_settings(); "
            "print(s.ATTEMPTS_BY_TYPE, s.WEBHOOK_ALLOWED_HOSTS)"
        )
        # The Configuration section extended the settings of the steps before it.
        assert "'marketing': 3" in conf and "('*', '127.0.0.1')" in conf, conf

        # The local webhook recipe: its channel posts to a receiver on 127.0.0.1, the public one stays
        # allowed (check above: no W002).
        url = re.search(r'"url": "(http://127\.0\.0\.1:(\d+)(/[^"]*))"', README)
        assert url is not None
        # The receiver takes a free port (the README's own port may be in use on this machine): the
        # channel the recipe created is pointed at it, path kept.
        receiver = ScriptedServer().start()
        local_url = f"http://127.0.0.1:{receiver.httpd.server_address[1]}{url[3]}"
        try:
            sent = project.python(
                "from notifications_retry import api; "
                "from notifications_retry.models import ChannelConfig; "
                f"ChannelConfig.objects.filter(key='local_hook').update(options={{'url': '{local_url}'}}); "
                "n = api.create_notification(channel='local_hook', recipient='me', payload={'hi': 1}); "
                "print(api.send_now(n).status)"
            )
        finally:
            receiver.stop()
        assert sent.strip().splitlines()[-1] == "sent", sent
        assert [request.path for request in receiver.requests] == [url[3]]
