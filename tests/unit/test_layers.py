"""The layering is enforced: a wrong-way import (models importing a provider, delivery importing the
engine...) fails the suite. The contracts are in pyproject.toml's ``[tool.importlinter]``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    result = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "3 kept, 0 broken" in result.stdout, result.stdout
