"""A copy of this checkout, as a newcomer's clone would hold it, and fresh virtual environments.

Built from a copy so that no ``build/``, ``dist/`` or ``*.egg-info`` lands in the working tree.
"""

from __future__ import annotations

import shutil
import subprocess
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What a clone does not hold (or holds only after local work): left out of the copy.
NOT_IN_A_CLONE = (
    ".venv",
    ".tox",
    ".git",
    ".pgdata",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "node_modules",
)


def copy_checkout(destination: Path) -> Path:
    """This checkout's files at ``destination`` (created), without local state."""
    shutil.copytree(ROOT, destination, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
    return destination


def fresh_venv(directory: Path, *, with_pip: bool = True) -> Path:
    """A new virtual environment at ``directory``; returns its ``bin`` directory."""
    venv.create(directory, with_pip=with_pip)
    return directory / "bin"


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """Run a command; its output, or an assertion error showing it when it fails."""
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr
