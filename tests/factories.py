"""factory-boy factories for the app's models."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import factory

from notifications_retry.models import ChannelConfig, NotificationEntity


class ChannelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ChannelConfig
        django_get_or_create = ("key",)

    key = factory.Sequence(lambda n: f"channel-{n}")
    provider_key = "in_app"
    is_enabled = True
    max_attempts = 3
    backoff_base_seconds = 60
    backoff_cap_seconds = 3600
    timeout_seconds = 5.0
    options: Any = factory.LazyFunction(dict)


class NotificationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = NotificationEntity

    id = factory.LazyFunction(uuid.uuid4)
    tenant_id = factory.LazyFunction(uuid.uuid4)
    channel = factory.SubFactory(ChannelFactory)
    recipient = factory.Sequence(lambda n: f"user{n}@example.com")
    payload: Any = factory.LazyFunction(lambda: {"subject": "Hello", "body": "Your order shipped"})
    status = NotificationEntity.Status.PENDING


def due_notifications(clock: Any, channel: ChannelConfig, count: int) -> list[NotificationEntity]:
    """``count`` Failed rows of ``channel`` due for their second attempt, the oldest first in line."""
    return [
        NotificationFactory(
            channel=channel,
            status=NotificationEntity.Status.FAILED,
            attempts=1,
            next_attempt_at=clock.now() - timedelta(seconds=i + 1),
        )
        for i in range(count)
    ]
