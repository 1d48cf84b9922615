"""The worker's and the relay's connections carry TCP keepalives and a TCP user timeout, so a network
partition ends a statement's wait in about 30 s instead of the kernel's quarter of an hour of
retransmissions (the behaviour itself: tests/faults, ``make faults``). A value the project gives wins."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections

from notifications_retry.database.locks import dedicated_connection
from notifications_retry.database.tcp_settings import TCP_SETTINGS
from notifications_retry.delivery.session import bound_connections

pytestmark = pytest.mark.django_db(transaction=True)

EXPECTED = {name: str(value) for name, value in TCP_SETTINGS.items()}


@pytest.fixture
def options(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The default alias's OPTIONS without the TCP settings (a command run in this process earlier gave
    them), restored (and the connection reopened) after the test."""
    settings_dict = connections.settings["default"]
    own = {k: v for k, v in (settings_dict.get("OPTIONS") or {}).items() if k not in TCP_SETTINGS}
    monkeypatch.setitem(settings_dict, "OPTIONS", own)
    yield own
    connection.close()


def libpq_parameters() -> dict[str, str]:
    connection.close()
    connection.ensure_connection()
    return dict(connection.connection.info.get_parameters())


def test_a_new_connection_carries_the_tcp_settings(options: dict[str, Any]) -> None:
    assert not any(name in libpq_parameters() for name in ("tcp_user_timeout", "keepalives_idle"))
    bound_connections("default")
    parameters = libpq_parameters()
    assert {name: parameters.get(name) for name in EXPECTED} == EXPECTED


def test_a_connection_open_before_is_replaced_at_its_next_statement(options: dict[str, Any]) -> None:
    # A command's system checks open the connection before the command runs: it must not go on without.
    connection.ensure_connection()
    bound_connections("default")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    parameters = dict(connection.connection.info.get_parameters())
    assert {name: parameters.get(name) for name in EXPECTED} == EXPECTED


def test_a_setting_the_alias_gives_keeps_its_value_and_the_others_are_added(options: dict[str, Any]) -> None:
    options["connect_timeout"] = 3
    bound_connections("default")
    parameters = libpq_parameters()
    assert parameters.get("connect_timeout") == "3", "the project's value wins"
    assert {name: parameters.get(name) for name in EXPECTED if name != "connect_timeout"} == {
        name: value for name, value in EXPECTED.items() if name != "connect_timeout"
    }


def test_the_locks_own_connection_carries_them(options: dict[str, Any]) -> None:
    with dedicated_connection("default", "nr-test") as conn:
        parameters = dict(conn.info.get_parameters())
    assert {name: parameters.get(name) for name in EXPECTED} == EXPECTED


@pytest.mark.parametrize(("command", "args"), [("retry_worker", ["--once"]), ("outbox_relay", ["--once"])])
def test_the_commands_give_their_process_the_tcp_settings(
    options: dict[str, Any], command: str, args: list[str]
) -> None:
    call_command(command, *args)
    assert {name: options.get(name) for name in TCP_SETTINGS} == TCP_SETTINGS
    parameters = libpq_parameters()
    assert {name: parameters.get(name) for name in EXPECTED} == EXPECTED
