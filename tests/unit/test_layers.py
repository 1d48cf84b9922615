"""The maps are enforced: a wrong-way import (models importing a provider, locks importing delivery...)
or a module no contract places fails the suite, and so does a write of a notification or outbox row
outside ``notifications_retry/delivery/``. The contracts are in pyproject.toml's ``[tool.importlinter]``."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "notifications_retry"
#: Model managers' and querysets' methods that write rows.
WRITES = {"create", "update", "delete", "bulk_create", "bulk_update", "get_or_create", "update_or_create"}
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


def writes_outside_delivery(source: str) -> list[str]:
    """The row writes in ``source``: ORM writes on NotificationEntity or Outbox, SQL writing their tables."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            names = {n.id for n in ast.walk(node.func.value) if isinstance(n, ast.Name)}
            if names & {"NotificationEntity", "Outbox"}:
                found.append(f"line {node.lineno}: .{node.func.attr}()")
        elif isinstance(node, ast.Constant | ast.JoinedStr):
            text = ast.unparse(node)
            if any(w in text for w in SQL_WRITES) and any(t in text for t in TABLES):
                found.append(f"line {node.lineno}: SQL")
    return found


def test_only_delivery_writes_notification_and_outbox_rows():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("delivery", "migrations") or relative.name == "db_rules.py":
            continue  # db_rules holds the triggers' own SQL; migrations install it
        found = writes_outside_delivery(path.read_text())
        if found:
            offenders[str(relative)] = found
    assert offenders == {}


def test_the_writer_check_sees_a_write():
    assert writes_outside_delivery("Outbox.objects.filter(pk=1).update(published_at=now)")
    assert writes_outside_delivery("NotificationEntity.objects.create(recipient='a')")
    assert writes_outside_delivery('SQL = f"UPDATE {_TABLE} SET attempts = 0"')
    assert not writes_outside_delivery("ChannelConfig.objects.filter(pk=1).update(is_enabled=False)")
