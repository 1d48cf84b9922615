"""Every settings snippet of the docs extends the README's ``NOTIFICATIONS_RETRY`` rather than replacing it.

A snippet of docs/providers.md once read ``NOTIFICATIONS_RETRY = {...}``: pasted after the README's
configuration, it silently dropped it. Each docs block that touches ``NOTIFICATIONS_RETRY`` is run here
as it would be pasted: after the README's own settings snippets (install step 2 defines the dict, later ones
add to it), in a namespace like a settings module's. What it leaves must keep every key the README set
and pass the settings validation (check E001's rules).
"""

from __future__ import annotations

import copy
import os
import re
import types
from pathlib import Path
from typing import Any
from unittest import mock

import dj_database_url
import pytest
from django.test import override_settings

from notifications_retry.conf import get_settings, settings_problems

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCK = re.compile(r"^([ ]*)```python\n(.*?)^\1```$", re.M | re.S)
DOCS = sorted((ROOT / "docs").rglob("*.md"))


def blocks(text: str) -> list[str]:
    found = []
    for match in PYTHON_BLOCK.finditer(text):
        indent = len(match[1])
        found.append("\n".join(line[indent:] for line in match[2].splitlines()))
    return found


def settings_blocks(text: str) -> list[str]:
    return [block for block in blocks(text) if "NOTIFICATIONS_RETRY" in block]


def readme_settings() -> dict[str, Any]:
    """The README's settings snippets that build NOTIFICATIONS_RETRY, run in order."""
    namespace: dict[str, Any] = {"INSTALLED_APPS": [], "MIDDLEWARE": [], "DEBUG": True}
    tagged = re.findall(r"<!-- snippet: settings\.py -->\n[ ]*```python\n(.*?)^[ ]*```$", README, re.M | re.S)
    # The block that defines the dict also reads the database from DATABASE_URL.
    with mock.patch.dict(os.environ, {"DATABASE_URL": "postgres://app@db:5432/app"}):
        for code in tagged:
            if "NOTIFICATIONS_RETRY" in code:
                lines = code.splitlines()
                indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
                exec("\n".join(line[indent:] for line in lines), namespace)
    # The settings, not the modules the snippets import.
    return {k: v for k, v in namespace.items() if not isinstance(v, types.ModuleType) and k != "__builtins__"}


def test_the_readme_defines_the_dict_once_and_only_extends_it_afterwards() -> None:
    assignments = [b for b in settings_blocks(README) if re.search(r"^\s*NOTIFICATIONS_RETRY\s*=", b, re.M)]
    assert len(assignments) == 1 and "NOTIFICATIONS_RETRY = {}" in assignments[0]
    assert readme_settings()["NOTIFICATIONS_RETRY"]["ATTEMPTS_BY_TYPE"] == {
        "transactional": 8,
        "marketing": 3,
    }


@pytest.mark.parametrize("doc", [d for d in DOCS if settings_blocks(d.read_text())], ids=lambda d: d.name)
def test_each_docs_snippet_pasted_after_the_readme_keeps_its_settings(
    doc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://app@pgbouncer:6432/app")
    monkeypatch.setenv("DATABASE_DIRECT_URL", "postgres://app@db:5432/app")
    base = readme_settings()
    for block in settings_blocks(doc.read_text()):
        assert not re.search(r"^\s*NOTIFICATIONS_RETRY\s*=", block, re.M), (
            f"{doc.name} replaces the dict:\n{block}"
        )
        namespace = {**copy.deepcopy(base), "os": __import__("os"), "dj_database_url": dj_database_url}
        exec(block, namespace)
        result = namespace["NOTIFICATIONS_RETRY"]
        kept = {k: v for k, v in base["NOTIFICATIONS_RETRY"].items() if k not in _set_by(block)}
        assert {k: result[k] for k in kept} == kept, f"{doc.name} dropped the README's settings:\n{block}"
        with override_settings(NOTIFICATIONS_RETRY=result):
            assert settings_problems(get_settings()) == [], block


def _set_by(block: str) -> set[str]:
    return set(re.findall(r'NOTIFICATIONS_RETRY\["(\w+)"\]\s*=', block)) | set(
        re.findall(r'^\s*"(\w+)":', block, re.M)
    )
