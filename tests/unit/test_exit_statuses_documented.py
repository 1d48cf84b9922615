"""docs/operations.md's exit-status table lists every status ``retry_worker`` and ``outbox_relay`` return.

Status 2 for ``LockNotDirect`` was once missing from it. The statuses a command can return are read from
its code (every ``returncode=`` it raises, and for the worker the ``--once`` statuses by failure kind),
plus 0 (success) and 1 (an uncaught exception).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from notifications_retry.engine.failures import EXIT_STATUS

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ROOT / "notifications_retry" / "management" / "commands"


def documented() -> dict[str, set[int]]:
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("### Exit statuses", 1)[1].split("\n\n", 2)[1]
    header, _, *rows = table.splitlines()
    names = [cell.strip().strip("`") for cell in header.strip("|").split("|")][1:]
    statuses: dict[str, set[int]] = {name: set() for name in names}
    for row in rows:
        status, *cells = (cell.strip() for cell in row.strip("|").split("|"))
        for name, cell in zip(names, cells, strict=True):
            if cell not in ("", "—"):
                statuses[name].add(int(status))
    return statuses


def returned_by(command: str) -> set[int]:
    source = (COMMANDS / f"{command}.py").read_text()
    found = {int(n) for n in re.findall(r"returncode=(\d+)", source)} | {0, 1}
    if "EXIT_STATUS" in source:
        found |= set(EXIT_STATUS.values())
    return found


@pytest.mark.parametrize("command", ["retry_worker", "outbox_relay"])
def test_the_table_lists_every_status_the_command_returns(command: str) -> None:
    assert documented()[command] == returned_by(command)


def test_lock_not_direct_is_documented_for_both_commands() -> None:
    table = (ROOT / "docs" / "operations.md").read_text().split("### Exit statuses", 1)[1]
    (row,) = [line for line in table.splitlines() if line.startswith("| 2 |")]
    assert row.count("LockNotDirect") == 2
