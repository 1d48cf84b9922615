"""Model validation gives clear errors; the database refuses what validation would."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from notifications_retry.models import ChannelConfig
from tests.factories import ChannelFactory

pytestmark = pytest.mark.django_db


def build(**overrides) -> ChannelConfig:
    values = dict(key="email", provider_key="stub", max_attempts=3, timeout_seconds=5.0)
    values.update(overrides)
    return ChannelConfig(**values)


@pytest.mark.parametrize(
    ("overrides", "field", "fragment"),
    [
        ({"max_attempts": 0}, "max_attempts", "greater than or equal to 1"),
        ({"timeout_seconds": 0}, "timeout_seconds", "greater than or equal to 0.001"),
        ({"provider_key": "carrier-pigeon"}, "provider_key", "unknown provider key 'carrier-pigeon'"),
        ({"retry_backoff": "linear"}, "retry_backoff", "not a valid choice"),
        (
            {"backoff_base_seconds": 100, "backoff_cap_seconds": 10},
            "backoff_cap_seconds",
            "at least the base",
        ),
        ({"provider_key": "webhook", "options": {}}, "options", "needs options['url']"),
        ({"max_concurrency": 0}, "max_concurrency", "greater than or equal to 1"),
        ({"key": "Not A Slug!"}, "key", "slug"),
    ],
)
def test_invalid_channel_is_rejected_with_a_clear_message(overrides, field, fragment):
    with pytest.raises(ValidationError) as info:
        build(**overrides).full_clean()
    messages = " ".join(info.value.message_dict.get(field, []))
    assert fragment.lower() in messages.lower(), info.value.message_dict


def test_valid_channel_passes():
    build(provider_key="webhook", options={"url": "https://hooks.example.com/x"}).full_clean()


@pytest.mark.parametrize(
    "overrides",
    [
        {"max_attempts": 0},
        {"timeout_seconds": 0},
        {"max_concurrency": 0},
        {"retry_backoff": "linear"},
        {"backoff_base_seconds": 100, "backoff_cap_seconds": 10},
        {"rate_limit_per_second": 0},
    ],
)
def test_database_constraints_back_the_validation(overrides):
    with pytest.raises(IntegrityError), transaction.atomic():
        build(**overrides).save()
    assert ChannelConfig.objects.count() == 0


def test_channel_problems_are_listed_for_operators():
    channel = ChannelFactory(key="hook", provider_key="webhook", options={"url": "gopher://x"})
    assert any("http(s) URL" in p for p in channel.configuration_problems())
