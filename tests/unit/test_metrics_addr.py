"""The commands' metrics endpoint listens on 127.0.0.1 unless ``--metrics-addr`` names another address,
and a bad address is refused with exit status 2 (the default itself is not checked as text, it needs no
check)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 some other socket listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("command", ["retry_worker", "outbox_relay"])
def test_the_endpoint_listens_on_the_loopback_address_by_default(command: str, taken_port: int) -> None:
    with pytest.raises(CommandError, match=f"cannot serve metrics on 127.0.0.1:{taken_port}") as raised:
        call_command(command, "--once", "--metrics-port", str(taken_port))
    assert raised.value.returncode == 2


@pytest.mark.parametrize("command", ["retry_worker", "outbox_relay"])
def test_a_bad_address_is_refused(command: str) -> None:
    with pytest.raises(CommandError, match="expected an IP address"):
        call_command(command, "--once", "--metrics-port", "0", "--metrics-addr", "localhost:9")
