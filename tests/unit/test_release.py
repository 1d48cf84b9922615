"""One version everywhere, and a new version with every schema change, checked without building.

``scripts/release_check.py`` (``make release-check``) holds the rules; this runs its version checks on the
checkout, and shows that each rule fails on a tree that breaks it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

import notifications_retry

ROOT = Path(__file__).resolve().parents[2]


def load_release_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_check", ROOT / "scripts" / "release_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("release_check", module)
    spec.loader.exec_module(module)
    return module


release_check = load_release_check()


def test_the_version_the_changelog_the_release_table_and_the_migrations_agree() -> None:
    assert release_check.version_problems(ROOT) == []


def test_the_wheel_takes_the_version_the_package_says() -> None:
    # The build reads the version from the attribute pyproject.toml names: the one __version__ is.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    module, _, name = pyproject["tool"]["setuptools"]["dynamic"]["version"]["attr"].rpartition(".")
    assert getattr(importlib.import_module(module), name) == notifications_retry.__version__
    assert release_check.package_version(ROOT) == notifications_retry.__version__


def test_the_changelog_is_release_notes() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert len(text.encode()) < 30_000
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings[0] == "Unreleased"
    top = release_check.changelog_releases(text)[0].version
    section = text.split(f"## [{top}]", 1)[1].split("\n## [", 1)[0]
    assert "docs/upgrading.md" in section  # the release's upgrade steps point at the guide
    for kind in re.findall(r"^### (\w+)", section, re.M):
        assert kind in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security", "Upgrading"}, kind


def tree(tmp_path: Path) -> Path:
    """The files the version checks read, copied from the checkout."""
    copy = tmp_path / "checkout"
    (copy / "docs").mkdir(parents=True)
    shutil.copytree(ROOT / "notifications_retry" / "migrations", copy / "notifications_retry" / "migrations")
    shutil.copy(ROOT / "notifications_retry" / "version.py", copy / "notifications_retry" / "version.py")
    shutil.copy(ROOT / "CHANGELOG.md", copy / "CHANGELOG.md")
    shutil.copy(ROOT / "docs" / "upgrading.md", copy / "docs" / "upgrading.md")
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_a_copy_of_the_checkout_passes(tmp_path: Path) -> None:
    assert release_check.version_problems(tree(tmp_path)) == []


def test_a_migration_newer_than_the_release_needs_a_new_version(tmp_path: Path) -> None:
    copy = tree(tmp_path)
    (copy / "notifications_retry" / "migrations" / "9999_a_later_change.py").write_text("")
    (problem,) = release_check.version_problems(copy)
    assert "9999_a_later_change" in problem and "a schema change takes a new version" in problem


def test_a_version_bumped_alone_disagrees_with_the_changelog_and_the_table(tmp_path: Path) -> None:
    copy = tree(tmp_path)
    version = notifications_retry.__version__
    edit(copy / "notifications_retry" / "version.py", f'"{version}"', '"99.0.0"')
    problems = release_check.version_problems(copy)
    assert any("CHANGELOG.md's top release" in p for p in problems)
    assert any("docs/upgrading.md's newest release" in p for p in problems)


def test_a_release_without_a_date_or_dated_twice_differently_is_refused(tmp_path: Path) -> None:
    copy = tree(tmp_path)
    version = notifications_retry.__version__
    heading = next(
        line
        for line in (copy / "CHANGELOG.md").read_text().splitlines()
        if line.startswith(f"## [{version}]")
    )
    edit(copy / "CHANGELOG.md", heading, f"## [{version}]")
    (problem,) = release_check.version_problems(copy)
    assert "is not a release heading" in problem
    edit(copy / "CHANGELOG.md", f"## [{version}]\n", f"## [{version}] - 1999-01-01\n")
    (problem,) = release_check.version_problems(copy)
    assert "1999-01-01 in CHANGELOG.md" in problem


def test_a_table_row_naming_a_migration_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    copy = tree(tmp_path)
    edit(copy / "docs" / "upgrading.md", "`0010_cheaper_due_at_and_event_ids`", "`0010_gone`")
    (problem,) = release_check.version_problems(copy)
    assert "0010_gone does not exist" in problem


@pytest.mark.parametrize("broken", [False, True])
def test_the_command_exits_1_on_a_disagreement_and_0_without(tmp_path: Path, broken: bool) -> None:
    copy = tree(tmp_path)
    if broken:
        (copy / "notifications_retry" / "migrations" / "9999_a_later_change.py").write_text("")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "release_check.py"), "--root", str(copy), "--versions-only"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == (1 if broken else 0), done.stdout + done.stderr
    assert ("FAILED" in done.stdout) is broken
