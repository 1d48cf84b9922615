"""Publisher registry for the outbox relay: built-ins ``log``, ``http``, ``rabbitmq`` and ``nats``, or a
dotted path. The broker publishers import their clients (extras ``rabbitmq``, ``nats``) when built.

Modules: :mod:`.base` (the interface and the reference publisher, ``log``), :mod:`.http`,
:mod:`.rabbitmq`, :mod:`.nats_jetstream` (the asynchronous brokers' clients run on
``asyncio_bridge.LoopThread``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.module_loading import import_string

from notifications_retry.outbox.publishers.base import LogPublisher, Publisher, PublishError
from notifications_retry.outbox.publishers.http import HttpPublisher
from notifications_retry.outbox.publishers.nats_jetstream import NatsPublisher
from notifications_retry.outbox.publishers.rabbitmq import RabbitMQPublisher

BUILTIN_PUBLISHERS: dict[str, type[Publisher]] = {
    LogPublisher.name: LogPublisher,
    HttpPublisher.name: HttpPublisher,
    RabbitMQPublisher.name: RabbitMQPublisher,
    NatsPublisher.name: NatsPublisher,
}

__all__ = [
    "BUILTIN_PUBLISHERS",
    "HttpPublisher",
    "LogPublisher",
    "NatsPublisher",
    "PublishError",
    "Publisher",
    "RabbitMQPublisher",
    "get_publisher",
    "get_publisher_class",
]


def get_publisher_class(name: str) -> type[Publisher]:
    """A built-in publisher by name, or a :class:`Publisher` subclass by dotted path."""
    if name in BUILTIN_PUBLISHERS:
        return BUILTIN_PUBLISHERS[name]
    if "." not in name:
        known = ", ".join(sorted(BUILTIN_PUBLISHERS))
        raise ValueError(f"unknown publisher {name!r}: use one of {known} or a dotted path")
    try:
        cls = import_string(name)
    except ImportError as exc:
        raise ValueError(f"publisher {name!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Publisher)):
        raise ValueError(
            f"publisher {name!r} is not a notifications_retry.outbox.publishers.Publisher subclass"
        )
    return cls


def get_publisher(name: str, options: Mapping[str, Any] | None = None) -> Publisher:
    """Build the publisher ``name`` with ``options``; ValueError with the reason when it cannot."""
    cls = get_publisher_class(name)
    problems = cls.options_problems(dict(options or {}))
    if problems:
        raise ValueError(f"publisher {name!r}: " + "; ".join(problems))
    return cls(options)
