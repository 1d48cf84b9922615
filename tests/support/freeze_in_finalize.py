"""A test-only app: the worker process freezes itself (SIGSTOP) inside its first bulk finalize transaction.

Installed by tests/settings.py when ``NR_TEST_FREEZE_IN_FINALIZE`` is set, so that a process test can
reach "a frozen worker holding an open transaction" deterministically rather than by timing a signal.
"""

from __future__ import annotations

import importlib
import signal
import threading

from django.apps import AppConfig


class FreezeInFinalizeConfig(AppConfig):
    name = "tests.support.freeze_in_finalize"
    label = "nr_test_freeze_in_finalize"

    def ready(self) -> None:
        # The module, not the function of the same name that the delivery package re-exports.
        finalize = importlib.import_module("notifications_retry.delivery.finalize")

        frozen = False

        def freeze() -> None:
            nonlocal frozen
            if not frozen:
                frozen = True
                # To this thread: a process-wide SIGSTOP is taken by whichever thread the kernel
                # picks, and until that one runs, a commit thread that sent it goes on to COMMIT.
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

        finalize.BEFORE_COMMIT = freeze
