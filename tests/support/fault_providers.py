"""Providers for the fault tests: one that kills its process, one that logs every call to a file."""

from __future__ import annotations

import asyncio
import os
import time
from typing import ClassVar

from notifications_retry.exceptions import ProviderThrottled
from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult


def _log_call(path: str | None, message: OutgoingMessage) -> None:
    if path:
        # O_APPEND writes of one short line are atomic, so concurrent processes do not interleave.
        with open(path, "a") as f:
            f.write(f"{os.getpid()} {message.notification_id} {message.attempt} {time.time():.6f}\n")


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


class SlowRecordingProvider(Provider):
    """Logs every call as it starts (pid, id, attempt), then answers after ``options["delay"]`` seconds:
    calls in flight a SIGKILL can interrupt, and which worker process made each call."""

    key: ClassVar[str] = "slow_recording"

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        _log_call(self.channel.options.get("call_log"), message)
        await asyncio.sleep(float(self.channel.options.get("delay", 0.05)))
        return SendResult(provider_message_id=f"rec:{message.notification_id}")


class DeadlineIgnoringProvider(Provider):
    """Claims to bound its own calls by the channel's timeout, then never answers (a provider bug)."""

    key: ClassVar[str] = "deadline_ignoring"
    enforces_timeout = True

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        _log_call(self.channel.options.get("call_log"), message)  # a call in flight, for the test to see
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class AbsurdAnswerProvider(Provider):
    """Answers with what a hostile server might make a client raise: ``options["answer"]`` picks it."""

    key: ClassVar[str] = "absurd_answer"

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        _log_call(self.channel.options.get("call_log"), message)
        answer = self.channel.options.get("answer")
        if answer == "overflow":
            raise OverflowError("date value out of range")
        if answer == "huge_retry_after":
            raise ProviderThrottled("429 with Retry-After: 999999999999", retry_after=999_999_999_999.0)
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON object")
