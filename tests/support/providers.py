"""Providers used only by tests."""

from __future__ import annotations

from typing import ClassVar

from notifications_retry.providers.base import OutgoingMessage, Provider, SendResult


class ExplodingProvider(Provider):
    """A provider with a bug: raises something that is not a ProviderError."""

    key: ClassVar[str] = "exploding"
    inline = True

    def send(self, message: OutgoingMessage) -> SendResult:
        raise RuntimeError("boom")
