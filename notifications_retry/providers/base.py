"""The provider interface: one class per delivery mechanism, one instance per channel (docs/contract.md)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any, ClassVar

from notifications_retry.conf.channel_settings import ChannelSettings as ChannelSettings
from notifications_retry.rules.outcomes import ClaimedRecord, Evidence


@dataclasses.dataclass(frozen=True)
class OutgoingMessage:
    """What a provider is asked to deliver; ``notification_id`` is the idempotency key."""

    notification_id: uuid.UUID
    tenant_id: uuid.UUID | None
    channel: str
    recipient: str
    payload: Any
    attempt: int
    priority: int
    notification_type: str

    @classmethod
    def of(cls, record: ClaimedRecord, channel: str) -> OutgoingMessage:
        """The message for a claimed (or leased) record on ``channel``: this attempt's number included."""
        return cls(
            notification_id=record.id,
            tenant_id=record.tenant_id,
            channel=channel,
            recipient=record.recipient,
            payload=record.payload,
            attempt=record.attempts,
            priority=record.priority,
            notification_type=record.notification_type,
        )


@dataclasses.dataclass(frozen=True)
class SendResult:
    """A delivered message; ``provider_message_id`` is what the provider calls it."""

    provider_message_id: str | None
    #: The answer (status, address) when the provider reports one; an attempt_log entry keeps it.
    evidence: Evidence | None = None


class Provider:
    """Base class of provider adapters.

    ``send`` runs with no database transaction open. It returns a :class:`SendResult` or raises
    :class:`~notifications_retry.exceptions.RetryableProviderError` /
    :class:`~notifications_retry.exceptions.PermanentProviderError`; anything else it raises
    is treated as a retriable failure of that one record.
    """

    key: ClassVar[str] = ""
    #: True only for providers whose ``send`` has no effect outside the database (no network, no
    #: files) and cannot hang: the worker calls them inside the claim transaction, on its own thread,
    #: and a rollback of that transaction must undo everything they did. An instance may decide for
    #: itself (the stub is inline unless told to wait).
    inline: bool = False
    #: True only when :meth:`send_async` itself gives up once the channel's ``timeout_seconds`` have
    #: passed, whatever the other side does (the webhook's requests carry that deadline). The worker
    #: then sets no watchdog timer of its own on the call; otherwise it abandons a call that outlives
    #: the timeout by a second.
    enforces_timeout: bool = False

    #: What a notification's payload must hold for this provider to send it, as groups of keys: each
    #: group is met by any one of its keys with a value (email: ``(("subject",), ("body", "html"))``).
    #: The public API refuses a payload that misses one (``InvalidNotification``, field ``payload``)
    #: instead of storing a row that could only become a dead letter. Empty: any JSON object.
    required_payload_keys: ClassVar[tuple[tuple[str, ...], ...]] = ()

    def __init__(self, channel: ChannelSettings) -> None:
        self.channel = channel

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        """Describe what is wrong with a channel's ``options`` for this provider; empty when valid."""
        if not isinstance(options, Mapping):
            return ["options must be a JSON object"]
        return []

    @classmethod
    def options_warnings(cls, options: Mapping[str, Any]) -> list[str]:
        """What may stop valid ``options`` from sending, found outside them (an ESP's credentials).

        Unlike :meth:`options_problems` it does not set the channel aside: ``check`` reports it (W008)
        and the admin's channel list shows it. Called only for options without problems.
        """
        return []

    @classmethod
    def payload_problems(cls, payload: Mapping[str, Any]) -> list[str]:
        """Why this provider cannot send ``payload`` (a JSON object), each naming the key; empty when it can.

        The default checks :attr:`required_payload_keys`; a provider may check more of the payload
        (types, unknown keys), never the recipient or the channel's options.
        """
        return [
            f"{' or '.join(repr(key) for key in group)} is required"
            for group in cls.required_payload_keys
            if not any(payload.get(key) is not None for key in group)
        ]

    def send(self, message: OutgoingMessage) -> SendResult:
        """Deliver one message, idempotently by ``message.notification_id``."""
        raise NotImplementedError

    async def send_async(self, message: OutgoingMessage) -> SendResult:
        """Deliver one message without blocking the event loop it is awaited on.

        Optional: a provider that overrides it is awaited on the worker's event loop, many sends at
        once on one thread; otherwise the worker calls :meth:`send` on a thread of its pool. The
        contract (result, errors, no transaction open) is :meth:`send`'s.
        """
        raise NotImplementedError

    @property
    def supports_async(self) -> bool:
        """Whether this provider overrides :meth:`send_async`."""
        return type(self).send_async is not Provider.send_async

    def close(self) -> None:
        """Release connections; called when the worker is done with the channel."""
