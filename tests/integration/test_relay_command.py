"""``manage.py outbox_relay``: one pass with a publisher, its exit statuses, its help."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from notifications_retry.models import Outbox
from tests.support.http_server import Reply
from tests.support.outbox_events import make_events


@pytest.mark.django_db
def test_command_once_drains_with_the_log_publisher(clock, capsys):
    make_events(clock, keys=2)
    call_command("outbox_relay", "--once", "--publisher", "log", "--batch-size", "3")
    assert "published 4 event(s)" in capsys.readouterr().out
    assert not Outbox.objects.filter(published_at__isnull=True).exists()


@pytest.mark.django_db
def test_command_once_exits_1_when_the_endpoint_is_down(clock, webhook_server, settings):
    settings.NOTIFICATIONS_RETRY = {"OUTBOX_PUBLISHER": "http", "OUTBOX_PUBLISHER_OPTIONS": {"retries": 0}}
    make_events(clock, keys=1)
    webhook_server.responder = lambda r: Reply(500)
    with pytest.raises(CommandError, match="publishing failed") as info:
        call_command("outbox_relay", "--once", "--publisher", "http", "--url", webhook_server.url)
    assert info.value.returncode == 1
    assert Outbox.objects.filter(published_at__isnull=True).count() == 2


@pytest.mark.django_db
def test_command_refuses_an_unusable_publisher():
    with pytest.raises(CommandError, match="'url' must be an http") as info:
        call_command("outbox_relay", "--once", "--publisher", "http")
    assert info.value.returncode == 2


def test_the_help_lists_every_built_in_publisher() -> None:
    from notifications_retry.management.commands.outbox_relay import Command
    from notifications_retry.outbox.publishers import BUILTIN_PUBLISHERS

    text = " ".join(Command().create_parser("manage.py", "outbox_relay").format_help().split())
    assert set(BUILTIN_PUBLISHERS) == {"log", "http", "rabbitmq", "nats"}
    for name in BUILTIN_PUBLISHERS:
        assert f"'{name}'" in text, text
