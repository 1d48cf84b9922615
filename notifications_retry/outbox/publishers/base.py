"""The publisher interface: how the outbox relay hands one event to the outside world."""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from typing import Any, ClassVar


def event_body(event: Mapping[str, Any]) -> bytes:
    """The event as compact JSON, identical at every re-publish of it."""
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()


class PublishError(Exception):
    """Publishing one event failed; the relay keeps it (and later events of its key) unpublished.

    ``endpoint_down`` says the destination itself is unavailable (connection refused, timeouts,
    5xx after retries): the relay then stops the batch instead of failing every other key too.
    """

    def __init__(self, message: str, *, endpoint_down: bool = False) -> None:
        super().__init__(message)
        self.endpoint_down = endpoint_down


class Publisher(abc.ABC):
    """Publishes events one at a time, in the order the relay gives them; raises PublishError."""

    name: ClassVar[str] = ""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    @classmethod
    def options_problems(cls, options: Mapping[str, Any]) -> list[str]:
        """What is wrong with ``options`` for this publisher; empty when usable."""
        return []

    @abc.abstractmethod
    def publish(self, event: Mapping[str, Any]) -> None:
        """Deliver one event (the envelope of ``events.envelope``); return only once it is accepted."""

    def close(self) -> None:  # noqa: B027 - an optional hook: most publishers hold nothing
        """Release clients and connections."""
