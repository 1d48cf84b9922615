"""The network fault suite runs only when asked (``make faults``): it needs root and takes minutes."""

from __future__ import annotations

import pytest

from tests.support.opt_in import skip_unless_asked

FAULTS_ENV = "NR_FAULTS"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--faults",
        action="store_true",
        default=False,
        help="Also run the network fault scenarios (@pytest.mark.faults); or set NR_FAULTS=1.",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_unless_asked(
        config,
        items,
        marker="faults",
        option="--faults",
        env=FAULTS_ENV,
        reason="network fault scenario: run with --faults or NR_FAULTS=1 (make faults)",
    )
