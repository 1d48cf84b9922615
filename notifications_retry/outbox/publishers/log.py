"""The ``log`` publisher: one structured log line per event (for development, or a log shipper)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import structlog

from notifications_retry.outbox.publishers.base import Publisher

log = structlog.get_logger("notifications_retry.outbox")


class LogPublisher(Publisher):
    """Writes ``outbox-event-published`` with the event's id, topic, key and payload."""

    name: ClassVar[str] = "log"

    def publish(self, event: Mapping[str, Any]) -> None:
        """Log the event; never fails."""
        log.info(
            "outbox-event-published",
            event_id=event["event_id"],
            topic=event["topic"],
            key=event["key"],
            generation=event["generation"],
            contract_version=event["contract_version"],
            payload=event["payload"],
        )
