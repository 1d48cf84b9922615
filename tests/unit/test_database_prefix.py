"""Every database the suite creates takes the prefix of NR_TEST_DATABASE_PREFIX, so several runs can share
one server without meeting each other's databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SHOW_NAMES = (
    "import json, os, django; django.setup(); from django.conf import settings; "
    "from tests.support.databases import database_name; "
    "print(json.dumps([settings.DATABASES['default']['TEST']['NAME'], database_name('nr_scratch_x')]))"
)


def names(prefix: str | None) -> list[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("NR_TEST_DATABASE_PREFIX", "NR_TEST_DATABASE_NAME")
    }
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    if prefix is not None:
        env["NR_TEST_DATABASE_PREFIX"] = prefix
    done = subprocess.run(
        [sys.executable, "-c", SHOW_NAMES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_test_database_and_scratch_databases_take_the_prefix() -> None:
    test_db, scratch = names("ci42_")
    assert test_db.startswith("ci42_test_nr_")
    assert scratch == "ci42_nr_scratch_x"


def test_without_a_prefix_the_names_are_unchanged() -> None:
    test_db, scratch = names(None)
    assert test_db.startswith("test_nr_")
    assert scratch == "nr_scratch_x"
