"""Providers for the fault tests: one that kills its process, one that logs every call to a file."""

from __future__ import annotations

import os
from typing import ClassVar

from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult


def _log_call(path: str | None, message: OutgoingMessage) -> None:
    if path:
        # O_APPEND writes of one short line are atomic, so concurrent processes do not interleave.
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {message.notification_id} {message.attempt}\n")


class ProcessCrashProvider(Provider):
    """Crashes the whole worker process (``os._exit``) when called: a provider bug, a segfault."""

    key: ClassVar[str] = "process_crash"

    def send(self, message: OutgoingMessage) -> SendResult:
        _log_call(self.channel.options.get("call_log"), message)
        os._exit(70)


class RecordingProvider(Provider):
    """Succeeds, and appends every call to ``options["call_log"]`` (counts calls across processes)."""

    key: ClassVar[str] = "recording"
    # Not inline: appending to a file is an effect outside the database, which a rolled-back claim
    # transaction could not undo.

    def send(self, message: OutgoingMessage) -> SendResult:
        _log_call(self.channel.options.get("call_log"), message)
        return SendResult(provider_message_id=f"rec:{message.notification_id}")
