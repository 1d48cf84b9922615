"""The publisher interface (how the outbox relay hands one event to the outside world) and its reference
publisher, ``log`` (:class:`LogPublisher`, the default)."""

from __future__ import annotations

import abc
import importlib
import json
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar

import structlog

log = structlog.get_logger("notifications_retry.outbox")


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
    """Publishes events in the relay's order (or in waves, with ``publish_many``); raises PublishError."""

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

    def publish_many(self, events: Sequence[Mapping[str, Any]]) -> list[PublishError | None]:
        """Deliver events of distinct keys at once (optional); one outcome per event, None = accepted.

        A publisher that overrides this is given the batch in waves holding at most one event per key,
        so it may have all of a wave in flight together (pipelined confirms) and keep no order among
        them; the relay waits for the wave's outcomes before the next one. A list shorter than
        ``events`` means the rest were not tried (the endpoint is down). Without an override the relay
        calls :meth:`publish` once per event, in order.
        """
        raise NotImplementedError

    @property
    def pipelines(self) -> bool:
        """Whether this publisher overrides :meth:`publish_many`."""
        return type(self).publish_many is not Publisher.publish_many

    def close(self) -> None:  # noqa: B027 - an optional hook: most publishers hold nothing
        """Release clients and connections."""


class LogPublisher(Publisher):
    """The ``log`` publisher: writes ``outbox-event-published`` with the event's id, topic, key and payload.

    One structured log line per event, for development or a log shipper.
    """

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


def broker_client(module: str, *, publisher: str, package: str, extra: str) -> ModuleType:
    """Import a broker's client library, an optional dependency: say which extra brings it if missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"the {publisher} publisher needs {package}: pip install 'django-notifications-retry[{extra}]'"
        ) from exc


def refuse_bad_options(publisher: str, problems: list[str]) -> None:
    """Raise one ValueError naming every problem of a publisher's options (none: do nothing)."""
    if problems:
        raise ValueError(f"{publisher} publisher: " + "; ".join(problems))
