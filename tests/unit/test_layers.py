"""The maps are enforced: a wrong-way import (models importing a provider, locks importing delivery...)
or a module no contract places fails the suite, and so does a write of a notification or outbox row
outside ``notifications_retry/delivery/``: a queryset's, raw SQL's, or an instance's ``.save()``. The
contracts are in pyproject.toml's ``[tool.importlinter]``."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "notifications_retry"
#: Model managers', querysets' and instances' methods that write rows.
WRITES = {
    "create",
    "update",
    "delete",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "save",
}
#: The models whose rows only delivery/ writes.
MODELS = {"NotificationEntity", "Outbox"}
#: Raw SQL that writes, and the tables delivery/ alone writes.
SQL_WRITES = ("UPDATE", "INSERT INTO", "DELETE FROM")
TABLES = ("notifications_retry_notificationentity", "notifications_retry_outbox", "_TABLE", "_OUTBOX")


def test_import_contracts_are_kept():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    result = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(contracts)} kept, 0 broken" in result.stdout, result.stdout
    # Every package of the app has its own exhaustive contract.
    placed = {c for contract in contracts for c in contract.get("containers", [])}
    packages = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in PACKAGE.rglob("__init__.py")
        if "migrations" not in p.parts and "commands" not in p.parts
    }
    assert packages - placed == set()


def _names_models(node: ast.AST | None) -> bool:
    """Whether ``node`` names either model (``Outbox``, ``models.Outbox``, ``list[Outbox]``)."""
    if node is None:
        return False
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    return bool(names & MODELS)


FUNCTIONS = ast.FunctionDef | ast.AsyncFunctionDef


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``scope`` outside the functions defined in it (each is a scope of its own)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, FUNCTIONS):
            stack.extend(ast.iter_child_nodes(node))


def _bound_to_models(nodes: list[ast.AST], bound: set[str]) -> set[str]:
    """What holds rows, querysets or managers of the two models, by its source text (``row``,
    ``self.row``): ``bound`` (the enclosing scope's), and what ``nodes`` assign from an expression naming
    a model or something bound, annotate with a model, or loop over such a thing. Passes repeat until
    none adds a name, so ``rows = qs.filter(); for row in rows`` is followed."""
    bound = set(bound)

    def holds(node: ast.AST | None) -> bool:
        if node is None:
            return False
        return _names_models(node) or any(
            ast.unparse(n) in bound for n in ast.walk(node) if isinstance(n, ast.expr)
        )

    while True:
        before = len(bound)
        for node in nodes:
            if isinstance(node, ast.Assign) and holds(node.value):
                bound.update(ast.unparse(t) for t in node.targets)
            elif isinstance(node, ast.AnnAssign) and (holds(node.annotation) or holds(node.value)):
                bound.add(ast.unparse(node.target))
            elif isinstance(node, ast.arg) and holds(node.annotation):
                bound.add(node.arg)
            elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension) and holds(node.iter):
                bound.update(ast.unparse(n) for n in ast.walk(node.target) if isinstance(n, ast.Name))
        if len(bound) == before:
            return bound


def _writes(scope: ast.AST, outer: set[str], found: set[tuple[int, str]]) -> None:
    nodes = list(_own_nodes(scope))
    bound = _bound_to_models(nodes, outer)
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            receiver = node.func.value
            if _names_models(receiver) or ast.unparse(receiver) in bound:
                found.add((node.lineno, f".{node.func.attr}()"))
        elif isinstance(node, ast.Constant | ast.JoinedStr):
            text = ast.unparse(node)
            if any(w in text for w in SQL_WRITES) and any(t in text for t in TABLES):
                found.add((node.lineno, "SQL"))
        elif isinstance(node, FUNCTIONS):
            _writes(node, bound, found)  # a closure sees its enclosing scope's names
        elif isinstance(node, ast.ClassDef) and node.name in MODELS:
            for method in (n for n in node.body if isinstance(n, FUNCTIONS)):
                _writes(method, bound | {"self"}, found)  # the models' own methods save ``self``


def writes_outside_delivery(source: str) -> list[str]:
    """The row writes in ``source``: ORM writes on NotificationEntity or Outbox (their managers,
    querysets and instances, ``.save()`` included), SQL writing their tables."""
    found: set[tuple[int, str]] = set()
    _writes(ast.parse(source), set(), found)
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_only_delivery_writes_notification_and_outbox_rows():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("delivery", "migrations") or relative.name == "triggers.py":
            continue  # triggers holds the triggers' own SQL; migrations install it
        found = writes_outside_delivery(path.read_text())
        if found:
            offenders[str(relative)] = found
    assert offenders == {}


def test_the_writer_check_sees_a_write():
    assert writes_outside_delivery("Outbox.objects.filter(pk=1).update(published_at=now)")
    assert writes_outside_delivery("NotificationEntity.objects.create(recipient='a')")
    assert writes_outside_delivery('SQL = f"UPDATE {_TABLE} SET attempts = 0"')
    assert not writes_outside_delivery("ChannelConfig.objects.filter(pk=1).update(is_enabled=False)")


def test_the_writer_check_sees_an_instance_saved():
    fetched = """
def requeue(pk):
    row = NotificationEntity.objects.get(pk=pk)
    row.attempts = 0
    row.save(update_fields=["attempts"])
"""
    assert writes_outside_delivery(fetched) == ["line 5: .save()"]
    annotated = "def mark(event: Outbox, now):\n    event.published_at = now\n    event.save()\n"
    assert writes_outside_delivery(annotated) == ["line 3: .save()"]
    looped = """
def stamp(ids):
    rows = models.NotificationEntity.objects.filter(id__in=ids)
    for row in rows:
        row.save()
    [r.delete() for r in rows]
"""
    assert writes_outside_delivery(looped) == ["line 5: .save()", "line 6: .delete()"]
    assert writes_outside_delivery("Outbox(topic='t', key='k').save()") == ["line 1: .save()"]
    assert writes_outside_delivery("self.row = NotificationEntity()\nself.row.save()") == ["line 2: .save()"]
    own_method = "class Outbox(Model):\n    def touch(self):\n        self.save()\n"
    assert writes_outside_delivery(own_method) == ["line 3: .save()"]
    # Other models' rows, and a name bound in another function, are not these writes.
    other = """
def enable(pk):
    channel = ChannelConfig.objects.get(pk=pk)
    channel.save()

def read(pk):
    row = NotificationEntity.objects.get(pk=pk)
    return row.status
"""
    assert writes_outside_delivery(other) == []
