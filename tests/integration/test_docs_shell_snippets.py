"""The docs' Python snippets: every block compiles, and those an operator pastes into ``manage.py shell``
(creating channels, reading queue stats, requeuing dead letters) run against PostgreSQL as written.

Each shell block runs on its own, in a savepoint rolled back afterwards (the docs show alternatives, not
one sequence), with the names a shell would have imported from the blocks before it in the same page.
docs/providers.md's own SMS provider module is written where its first line says and registered, so
the channels that use it are created against the provider the page defines.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings

from notifications_retry.models import ChannelConfig

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([*(ROOT / "docs").rglob("*.md")])
PYTHON_BLOCK = re.compile(r"^([ ]*)```python\n(.*?)^\1```$", re.M | re.S)
SHELL = re.compile(r"\.objects\.|queue_stats\(|requeue_dead_letters\(")
MODULE = re.compile(r"^# (\w+(?:/\w+)+\.py)\n")

pytestmark = pytest.mark.django_db


def blocks(doc: Path) -> list[str]:
    found = []
    for match in PYTHON_BLOCK.finditer(doc.read_text()):
        indent = len(match[1])
        found.append("\n".join(line[indent:] for line in match[2].splitlines()) + "\n")
    return found


@pytest.mark.parametrize("doc", [d for d in DOCS if blocks(d)], ids=lambda d: d.relative_to(ROOT).as_posix())
def test_every_python_block_compiles(doc: Path) -> None:
    for block in blocks(doc):
        compile(block, str(doc), "exec")


@pytest.fixture
def docs_modules(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path where the docs' module snippets are written."""
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n == "myproject" or n.startswith("myproject.")]:
        del sys.modules[name]


SHELL_DOCS = [d for d in DOCS if any(SHELL.search(b) for b in blocks(d))]


@pytest.mark.parametrize("doc", SHELL_DOCS, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_the_shell_snippets_run_as_written(doc: Path, docs_modules: Path) -> None:
    providers: dict[str, str] = {}
    for block in blocks(doc):
        module = MODULE.match(block)
        if module:
            path = docs_modules / module[1]
            for parent in list(reversed(path.relative_to(docs_modules).parents))[1:]:  # not the root
                (docs_modules / parent).mkdir(exist_ok=True)
                (docs_modules / parent / "__init__.py").touch()
            path.write_text(block)
            dotted = module[1].removesuffix(".py").replace("/", ".")
            keys = re.findall(r'key: ClassVar\[str\] = "(\w+)"', block)
            classes = re.findall(r"^class (\w+)\(Provider\)", block, re.M)
            providers.update({key: f"{dotted}.{cls}" for key, cls in zip(keys, classes, strict=True)})
    shell_blocks = [b for b in blocks(doc) if SHELL.search(b) and not MODULE.match(b)]
    assert shell_blocks
    with override_settings(NOTIFICATIONS_RETRY={"PROVIDERS": providers}):
        for block in shell_blocks:
            namespace = {"ChannelConfig": ChannelConfig}  # the pages' snippets assume it imported
            with transaction.atomic():
                exec(compile(block, str(doc), "exec"), namespace)
                for channel in ChannelConfig.objects.all():
                    channel.full_clean()  # what the page creates is valid, not merely stored
                transaction.set_rollback(True)
