"""``manage.py outbox_relay``: one pass with a publisher, its exit statuses, its help."""

from __future__ import annotations

import json
import time

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


@pytest.mark.django_db
def test_the_relay_writes_the_heartbeat_file_its_check_reads(clock, tmp_path, capsys):
    # The separate relay Deployment's liveness probe: the relay beats after every batch, --check reads it.
    beat = tmp_path / "relay.heartbeat"
    make_events(clock, keys=1)
    call_command("outbox_relay", "--once", "--publisher", "log", "--heartbeat-file", str(beat))
    assert json.loads(beat.read_text())["lane"] == "outbox-relay"
    call_command("outbox_relay", "--check", "--heartbeat-file", str(beat))
    assert capsys.readouterr().out.splitlines()[-1].startswith("healthy")


def test_the_relay_check_fails_on_an_old_missing_or_foreign_heartbeat(tmp_path):
    old = tmp_path / "old.heartbeat"
    old.write_text(json.dumps({"pid": 1, "lane": "outbox-relay", "partitions": [], "at": time.time() - 181}))
    worker = tmp_path / "worker.heartbeat"
    worker.write_text(json.dumps({"pid": 1, "lane": "default", "partitions": [], "at": time.time()}))
    for path in (old, worker, tmp_path / "missing.heartbeat"):
        with pytest.raises(CommandError, match="unhealthy") as info:
            call_command("outbox_relay", "--check", "--heartbeat-file", str(path))
        assert info.value.returncode == 1


def test_the_relay_check_needs_its_heartbeat_file():
    with pytest.raises(CommandError, match="--heartbeat-file") as info:
        call_command("outbox_relay", "--check")
    assert info.value.returncode == 2
