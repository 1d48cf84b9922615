"""``make test`` says what it installs before it does, and docs/development.md lists it.

Each ``scripts/ensure-*`` that runs ``apt-get install`` prints, before it, one line per package naming it
and why; docs/development.md names every package ``make test``'s scripts may install.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("ensure-*") if "apt-get install" in p.read_text())


def installed_packages(script: str) -> list[str]:
    """The packages a script's ``apt-get install`` names (or adds to its ``missing`` list)."""
    line = next(line for line in script.splitlines() if "apt-get install" in line)
    named = [word for word in line.split() if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", word)]
    named = [word for word in named if word not in ("apt-get", "install")]
    return named + re.findall(r"missing\+=\(([a-z0-9.+-]+)\)", script)


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_each_package_is_announced_with_its_reason_before_apt_get_runs(path: Path) -> None:
    script = path.read_text()
    before = script.split("apt-get update", 1)[0]
    packages = installed_packages(script)
    assert packages, path.name
    for package in packages:
        named = rf"(\$package|{re.escape(package)})"
        announced = re.search(rf'echo "{path.name}: installing {named} with apt-get[^"]*: [^"]+', before)
        assert announced, f"{path.name} installs {package} without saying so first"


def test_the_readme_lists_what_make_test_installs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    development = (
        (ROOT / "docs" / "development.md").read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    )
    for name in re.findall(r"bash scripts/(ensure-[\w-]+)", recipe):
        script = (ROOT / "scripts" / name).read_text()
        if "apt-get install" not in script:
            continue
        for package in installed_packages(script):
            assert f"`{package}`" in development, f"docs/development.md does not list {package}"
