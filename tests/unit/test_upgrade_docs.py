"""docs/upgrading.md and the exit-status table say what the code does."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from notifications_retry.engine import failures

ROOT = Path(__file__).resolve().parents[2]
UPGRADING = (ROOT / "docs" / "upgrading.md").read_text()
MOVED = re.compile(r"^\| `(notifications_retry[\w.]*)`[^|]*\| `(notifications_retry[\w.]*)`[^|]*\|$", re.M)


def exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is gone
        return False


def latest(module: str, moves: dict[str, str]) -> str:
    """Where a module is now: a release's new path may have moved again in a later one."""
    seen = {module}
    while module in moves and moves[module] != module:
        module = moves[module]
        assert module not in seen, f"the moves go round: {module}"
        seen.add(module)
    return module


def test_every_moved_module_is_gone_from_its_old_path_and_imports_from_where_it_is_now():
    moves = MOVED.findall(UPGRADING)
    assert len(moves) >= 10
    later = dict(moves)
    for old, new in moves:
        assert exists(latest(new, later)), new
        if old != new:
            assert not exists(old), f"{old} still exists: the table says it moved"


def test_the_latest_path_follows_a_module_moved_twice():
    moves = {"a.send_loop": "a.asyncio_bridge", "a.asyncio_bridge": "a.runtime.asyncio_bridge"}
    assert latest("a.asyncio_bridge", moves) == "a.runtime.asyncio_bridge"
    assert latest("a.kept", moves) == "a.kept"


def test_the_exit_statuses_documented_are_the_ones_retry_worker_uses():
    operations = (ROOT / "docs" / "operations.md").read_text()
    table = dict(re.findall(r"^\| (\d) \| (.+) \|$", operations, re.M))
    assert "unreachable" in table[str(failures.EXIT_STATUS[failures.UNREACHABLE])]
    assert "not migrated" in table[str(failures.EXIT_STATUS[failures.NOT_MIGRATED])]
    assert "lock" in table["0"] and "bad options" in table["2"]
