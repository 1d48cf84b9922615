"""Scenarios that run only when asked (benchmark smoke tests, soak, network faults): one rule for all."""

from __future__ import annotations

import os

import pytest


def asked_for(config: pytest.Config, option: str, env: str) -> bool:
    """``option`` on the command line (when its conftest was loaded) or ``env`` set to anything but 0."""
    try:
        flag = bool(config.getoption(option))
    except ValueError:  # the option's conftest is not on this run's path
        flag = False
    return flag or os.environ.get(env, "") not in ("", "0")


def skip_unless_asked(
    config: pytest.Config, items: list[pytest.Item], *, marker: str, option: str, env: str, reason: str
) -> None:
    """Skip the tests marked ``marker`` unless they were asked for (skipped, never deselected: a run
    of only such tests still collects something, so pytest does not exit with 5)."""
    if asked_for(config, option, env):
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        # The marker itself, not ``item.keywords``: those hold every parent directory's name too.
        if item.get_closest_marker(marker) is not None:
            item.add_marker(skip)
