"""The feature-flagged external channels (email, sms, push) until a real adapter is plugged in."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ..exceptions import PermanentProviderError, ProviderError, ProviderThrottled, RetryableProviderError
from .base import OutgoingMessage, Provider, SendResult

_FAILURES: dict[str, Callable[[], ProviderError]] = {
    "retriable": lambda: RetryableProviderError("stub told to fail (retriable)", kind="stub_retriable"),
    "permanent": lambda: PermanentProviderError("stub told to fail (permanent)", kind="stub_permanent"),
    "throttled": lambda: ProviderThrottled("stub told to throttle", retry_after=60.0),
}


class StubProvider(Provider):
    """No network: records a deterministic id; ``options`` can make it fail or wait.

    Options: ``fail`` (``retriable`` / ``permanent`` / ``throttled``), ``fail_recipients`` (fail only
    for these recipients), ``delay_seconds`` (simulated latency).
    """

    key: ClassVar[str] = "stub"
    inline = True

    def __init__(self, channel: Any) -> None:
        super().__init__(channel)
        options = channel.options
        self.fail = options.get("fail")
        self.fail_recipients = set(options.get("fail_recipients") or ())
        self.delay_seconds = float(options.get("delay_seconds") or 0)
        # Only a stub that waits needs the worker's thread pool.
        self.inline = self.delay_seconds == 0

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        problems = super().options_problems(options)
        if problems:
            return problems
        fail = options.get("fail")
        if fail is not None and (not isinstance(fail, str) or fail not in _FAILURES):
            problems.append(f"stub option 'fail' must be one of {sorted(_FAILURES)}, got {fail!r}")
        delay = options.get("delay_seconds", 0)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
            problems.append(f"stub option 'delay_seconds' must be a number >= 0, got {delay!r}")
        recipients = options.get("fail_recipients", [])
        if not isinstance(recipients, list) or not all(isinstance(r, str) for r in recipients):
            problems.append("stub option 'fail_recipients' must be a list of strings")
        return problems

    def send(self, message: OutgoingMessage) -> SendResult:
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        if self.fail and (not self.fail_recipients or message.recipient in self.fail_recipients):
            raise _FAILURES[self.fail]()
        return SendResult(provider_message_id=f"stub:{message.channel}:{message.notification_id}")
