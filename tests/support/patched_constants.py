"""A test-only app: a worker subprocess sets the app's module constants named in ``NR_TEST_CONSTANTS_JSON``.

Installed by tests/settings.py when ``NR_TEST_CONSTANTS_JSON`` is set, e.g.
``{"notifications_retry.delivery.session.TRANSACTION_TIMEOUT_SECONDS": 10}``, for a scenario whose
timings are written around a shorter internal bound than the shipped one (tests/faults: a 20 s partition
against a 10 s transaction bound, the figures of docs/guarantees.md). Only a constant read when it is
used can be set this way. A name the module does not have is an error: a renamed constant fails the
scenario instead of being set on nothing.
"""

from __future__ import annotations

import importlib
import json
import os

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

ENVIRONMENT = "NR_TEST_CONSTANTS_JSON"


class PatchedConstantsConfig(AppConfig):
    name = "tests.support.patched_constants"
    label = "nr_test_patched_constants"

    def ready(self) -> None:
        for dotted, value in json.loads(os.environ[ENVIRONMENT]).items():
            module_name, _, name = dotted.rpartition(".")
            module = importlib.import_module(module_name)
            if not hasattr(module, name):
                raise ImproperlyConfigured(f"{ENVIRONMENT}: {module_name} has no constant {name}")
            setattr(module, name, value)
