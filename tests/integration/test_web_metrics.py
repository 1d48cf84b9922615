"""A web process's /metrics (django-prometheus) and docs/observability.md agree: no notifications_* series."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# A fresh process, as a web worker is: Django set up, the URLconf (admin included) loaded by the request.
WEB_PROCESS = """
import sys
import django
django.setup()
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
response = Client().get("/metrics")
assert response.status_code == 200, response.status_code
sys.stdout.write(response.content.decode())
"""


def test_the_web_process_metrics_have_no_worker_series_as_the_docs_say():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", WEB_PROCESS],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    names = {line.split("{")[0].split(" ")[0] for line in result.stdout.splitlines() if line[:1] not in "#"}
    assert "process_start_time_seconds" in names and "python_info" in names, sorted(names)
    assert not [name for name in names if name.startswith("notifications_")]
    docs = " ".join((REPO_ROOT / "docs" / "observability.md").read_text().split())
    assert "The web process's `/metrics` (django-prometheus) serves no `notifications_*` series" in docs
