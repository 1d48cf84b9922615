"""In-app delivery: the notification row itself is the user's in-app message."""

from __future__ import annotations

from typing import ClassVar

from .base import OutgoingMessage, Provider, SendResult


class InAppProvider(Provider):
    """Delivered by being marked Sent: the monolith's inbox reads Sent in-app rows."""

    key: ClassVar[str] = "in_app"
    inline = True

    def send(self, message: OutgoingMessage) -> SendResult:
        return SendResult(provider_message_id=f"in_app:{message.notification_id}")
