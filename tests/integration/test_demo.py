"""``make demo`` as a newcomer runs it: the table, its headline, reruns, the README's sample, the admin,
and the embedded PostgreSQL that must not outlive it (or be deleted under a running server).

The tests share one embedded server's data directory (initdb and migrate once); the last one deletes it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import stop_with

# The demo's embedded PostgreSQL: pgserver publishes no wheel for Python 3.13 (the example extra
# leaves it out there), and the demo then needs DATABASE_URL (test_embedded_postgres checks it says so).
pytest.importorskip("pgserver", reason="pgserver has no wheel for this Python: the demo needs DATABASE_URL")

ROOT = Path(__file__).resolve().parents[2]
STABLE_COLUMNS = ("case", "channel", "before", "after", "attempts", "event")


def demo_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "NR_")) and k != "DATABASE_URL"
    }
    # PYTHONFAULTHANDLER: a server that does not stop prints its threads' stacks when stop_with ends it.
    env.update(
        DJANGO_SETTINGS_MODULE="example_project.settings",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",
        **extra,
    )
    return env


def manage(*args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 120) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def parse_table(text: str) -> tuple[dict[str, int], list[dict[str, str]], str]:
    """The headline's counts, the table's rows by column name, and the header line."""
    lines = text.splitlines()
    headline = next(line for line in lines if line.startswith("worker tick:"))
    counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", headline)}
    header_at = next(i for i, line in enumerate(lines) if line.startswith("case "))
    header, rule = lines[header_at], lines[header_at + 1]
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", rule)]
    names = [header[start:end].strip() for start, end in spans]
    rows = []
    for line in lines[header_at + 2 :]:
        if not line.strip():
            break
        cells = [
            line[start : (spans[i + 1][0] if i + 1 < len(spans) else None)].strip()
            for i, (start, _) in enumerate(spans)
        ]
        rows.append(dict(zip(names, cells, strict=True)))
    return counts, rows, header


def counted_from(rows: list[dict[str, str]]) -> dict[str, int]:
    """What the table shows, counted the way the headline should count it."""
    sent = sum(r["after"] == "sent" and r["before"] != "sent" for r in rows)
    terminal = sum(r["after"] == "failed (dead letter)" for r in rows)
    retried = sum(r["before"] == r["after"] == "failed" and r["next attempt"].startswith("in ") for r in rows)
    disabled = sum("disabled" in r["case"] and r["before"] == r["after"] for r in rows)
    return {
        "processed": sent + retried + terminal,
        "sent": sent,
        "retried": retried,
        "terminal": terminal,
        "channel_disabled": disabled,
    }


@pytest.fixture(scope="module")
def pgdata() -> Iterator[Path]:
    """The embedded server's data directory, as ``make demo`` uses it (no DATABASE_URL).

    Not under pytest's temporary directory: run as root, pgserver starts PostgreSQL as its own user,
    and every pytest run on the machine makes pytest's directory private to root again.
    """
    scratch = Path(tempfile.mkdtemp(prefix="nr_demo_"))
    data = scratch / ".pgdata"
    yield data
    if (data / "postmaster.pid").exists():  # a failed test left it running
        subprocess.run(
            [sys.executable, "-m", "example_project.embedded_postgres", "stop"],
            cwd=ROOT,
            env=demo_env(PGSERVER_DATA_DIR=str(data)),
            timeout=60,
        )
    shutil.rmtree(scratch, ignore_errors=True)


def assert_stopped(pgdata: Path) -> None:
    assert (pgdata / "PG_VERSION").exists()
    assert not (pgdata / "postmaster.pid").exists(), "the embedded PostgreSQL outlived the command"


def test_reruns_report_their_own_rows_and_the_readme_sample_matches(pgdata: Path):
    env = demo_env(PGSERVER_DATA_DIR=str(pgdata))
    first = manage("demo", env=env)
    assert_stopped(pgdata)
    second = manage("demo", env=env)
    assert_stopped(pgdata)
    for output in (first, second):
        assert "embedded PostgreSQL (pgserver) in" in output and "stops when this command exits" in output
        counts, rows, _ = parse_table(output)
        assert len(rows) == 7
        assert (
            {k: counts[k] for k in counted_from(rows)}
            == counted_from(rows)
            == {
                "processed": 4,
                "sent": 2,
                "retried": 1,
                "terminal": 1,
                "channel_disabled": 1,
            }
        )
        assert "make demo-admin" in output
    assert "earlier demo runs" not in first
    assert "(the same tick also handled rows of earlier demo runs: channel_disabled=1)" in second

    readme = (ROOT / "README.md").read_text()
    sample = readme.split("<!-- demo-output -->\n```\n", 1)[1].split("```", 1)[0]
    sample_counts, sample_rows, sample_header = parse_table(sample)
    _, rows, header = parse_table(second)
    assert sample_header == header
    assert {k: sample_counts[k] for k in counted_from(sample_rows)} == counted_from(sample_rows)
    assert sample.splitlines()[0] == next(
        line for line in second.splitlines() if line.startswith("worker tick:")
    )
    assert [{c: r[c] for c in STABLE_COLUMNS} for r in sample_rows] == [
        {c: r[c] for c in STABLE_COLUMNS} for r in rows
    ]
    shape = re.compile(r"in_app:[0-9a-f-]{36}|in \d+s")
    assert [shape.sub("*", r["provider id / error"]) for r in sample_rows] == [
        shape.sub("*", r["provider id / error"]) for r in rows
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_demo_admin_creates_a_superuser_whose_printed_credentials_open_the_admin(
    pgdata: Path, stop_signal: signal.Signals
):
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "manage.py", "demo_admin", "--port", str(port)],
        cwd=ROOT,
        env=demo_env(PGSERVER_DATA_DIR=str(pgdata)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed: dict[str, str] = {}
        seen: list[str] = []
        assert server.stdout is not None
        while "password" not in printed:
            line = server.stdout.readline()
            assert line, "demo_admin exited before printing the credentials:\n" + "".join(seen)
            seen.append(line)
            if ":" in line and line.startswith("  "):
                key, value = line.strip().split(":", 1)
                printed[key] = value.strip()
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(100):
                try:
                    login = client.get("/admin/login/")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)[1]
            refused = client.post(
                "/admin/login/",
                data={"username": printed["username"], "password": "wrong", "csrfmiddlewaretoken": token},
            )
            assert refused.status_code == 200 and "Please enter the correct username" in refused.text
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', refused.text)[1]
            accepted = client.post(
                "/admin/login/?next=/admin/",
                data={
                    "username": printed["username"],
                    "password": printed["password"],
                    "csrfmiddlewaretoken": token,
                },
            )
            assert accepted.status_code == 302 and accepted.headers["location"] == "/admin/"
            listing = client.get("/admin/notifications_retry/notificationentity/")
            assert listing.status_code == 200
            # The demo's rows are listed (the list shows ids, not recipients: those are on the detail page).
            rows = re.findall(r'<tr[^>]*>\s*<td class="action-checkbox">', listing.text)
            assert len(rows) >= 7, listing.text[-2000:]
    finally:
        # Ctrl-C, as the printed hint says, or SIGTERM (kill, timeout, a container stop): either stops
        # the embedded PostgreSQL with the server.
        stop_with(server, stop_signal, timeout=30)
    assert server.returncode == 0
    assert_stopped(pgdata)


@pytest.mark.timeout(180)
def test_clean_never_deletes_pgdata_under_a_running_server(pgdata: Path):
    data, scratch = pgdata, pgdata.parent
    env = demo_env(PGSERVER_DATA_DIR=str(data))

    # A demo that was killed leaves its server running: start one that outlives its process.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import pgserver, sys; pgserver.get_server(sys.argv[1], cleanup_mode=None)",
            str(data),
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert (data / "postmaster.pid").exists()
    shutil.copy(ROOT / "Makefile", scratch / "Makefile")
    # No venv in the scratch directory: clean cannot stop the server, so it must refuse.
    make_env = {**env, "PYTHONPATH": str(ROOT)}
    refused = subprocess.run(
        ["make", "-s", "clean", f"VENV={scratch / 'no-venv'}"],
        cwd=scratch,
        env=make_env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "still runs in .pgdata" in refused.stderr
    assert (data / "PG_VERSION").exists()
    stopped = subprocess.run(
        ["make", "-s", "clean", f"VENV={scratch / 'no-venv'}", f"PY={sys.executable}"],
        cwd=scratch,
        env=make_env,
        capture_output=True,
        text=True,
    )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopped the PostgreSQL server" in stopped.stdout
    assert not data.exists()
