"""Importing the package loads no models and reads no settings (Django imports it before apps are ready)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_loads_no_models_and_needs_no_settings() -> None:
    code = (
        "import sys, notifications_retry\n"
        "assert 'notifications_retry.models' not in sys.modules, 'models imported'\n"
        "assert 'notifications_retry.api' not in sys.modules, 'api imported eagerly'\n"
        "print(notifications_retry.__version__)\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no DJANGO_SETTINGS_MODULE: nothing may read settings
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == __import__("notifications_retry").__version__


def test_unknown_attribute_is_an_attribute_error() -> None:
    import notifications_retry

    try:
        notifications_retry.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_version_matches_the_distribution_metadata() -> None:
    import tomllib
    from importlib import metadata

    import notifications_retry

    # One home: the build reads the version from notifications_retry/version.py.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "notifications_retry.version.__version__"
    }
    assert metadata.version("django-notifications-retry") == notifications_retry.__version__
