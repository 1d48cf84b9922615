"""The app's ``ready()`` registers the system checks and connects the anymail tracking receiver, and
imports the two modules without asking the package for an exported name of theirs (its ``__getattr__``,
the public API's import hook)."""

from __future__ import annotations

import pytest

from tests.support.processes import fresh_interpreter

PROBE = """
import notifications_retry
asked = []
export = notifications_retry.__getattr__
def watched(name):
    asked.append(name)
    return export(name)
notifications_retry.__getattr__ = watched
import django
django.setup()
print(sorted({"checks", "tracking"} & set(asked)))
from django.core.checks import registry
from anymail.signals import tracking
from notifications_retry.checks import check_settings
from notifications_retry.tracking import on_tracking
receivers = tracking._live_receivers(None)[0]
print(check_settings in registry.registry.registered_checks, on_tracking in receivers)
"""


def test_ready_registers_the_checks_and_connects_the_receiver_without_the_lazy_exports() -> None:
    pytest.importorskip("anymail")
    assert fresh_interpreter(PROBE).split("\n")[:2] == ["[]", "True True"]
