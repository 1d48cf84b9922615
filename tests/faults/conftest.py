"""The network fault suite runs only when asked (``make faults``): it needs root and takes minutes."""

from __future__ import annotations

import os

import pytest

FAULTS_ENV = "NR_FAULTS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        action="store_true",
        default=False,
        help="Also run the network fault scenarios (@pytest.mark.faults); or set NR_FAULTS=1.",
    )


def faults_enabled(config: pytest.Config) -> bool:
    """``--faults`` (when this directory is on the command line) or ``NR_FAULTS=1``."""
    try:
        flag = bool(config.getoption("--faults"))
    except ValueError:
        flag = False
    return flag or os.environ.get(FAULTS_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if faults_enabled(config):
        return
    skip = pytest.mark.skip(reason="network fault scenario: run with --faults or NR_FAULTS=1 (make faults)")
    for item in items:
        # The marker itself, not ``item.keywords``: those hold every parent's name, this directory's too,
        # so every test collected alongside it (``pytest tests/unit tests/faults``) would match.
        if item.get_closest_marker("faults") is not None:
            item.add_marker(skip)
