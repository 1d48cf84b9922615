"""Fixtures of the integration tests that need a real broker: names of their own, removed after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.brokers import NatsBox, RabbitMQBox, nats_box, rabbitmq_box


@pytest.fixture
def rabbitmq() -> Iterator[RabbitMQBox]:
    yield from rabbitmq_box()


@pytest.fixture
def jetstream() -> Iterator[NatsBox]:
    yield from nats_box()
