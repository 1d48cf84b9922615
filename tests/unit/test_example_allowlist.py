"""The example project reads its webhook allowlist from NOTIFICATIONS_RETRY_WEBHOOK_ALLOWED_HOSTS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READ = (
    "import json, example_project.settings as s; "
    "print(json.dumps(s.NOTIFICATIONS_RETRY['WEBHOOK_ALLOWED_HOSTS']))"
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ("", []),
        ("127.0.0.1", ["127.0.0.1"]),
        (" 127.0.0.1, 10.0.0.0/8 ,,hooks.example.com ", ["127.0.0.1", "10.0.0.0/8", "hooks.example.com"]),
    ],
)
def test_allowlist_comes_from_the_environment(value: str | None, expected: list[str]) -> None:
    env = {**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres"}
    env.pop("NOTIFICATIONS_RETRY_WEBHOOK_ALLOWED_HOSTS", None)
    if value is not None:
        env["NOTIFICATIONS_RETRY_WEBHOOK_ALLOWED_HOSTS"] = value
    result = subprocess.run(
        [sys.executable, "-c", READ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == expected
