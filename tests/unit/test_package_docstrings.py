"""Every package's docstring names its modules, so a reader of ``__init__`` finds every file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "notifications_retry"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(PACKAGE.parent).as_posix())
def test_the_docstring_names_every_module(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    modules += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [m for m in modules if f".{m}" not in docstring and f"``{m}``" not in docstring]
    assert missing == []
