"""The SSRF corpus refused at every layer: model validation, plain ``check``, the send and the worker.

One test per class and layer. Real sends only go to a loopback receiver, which must never be reached
without an allowlist and is reached with one. Names that resolve inside come from a fake
``socket.getaddrinfo`` (the one aiohttp's resolver and the policy's lookups both call).
"""

# ruff: noqa: RUF001  (full-width digits are the point: hosts spelled to slip past the policy)
from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.exceptions import ValidationError

from notifications_retry.engine.worker import Worker
from notifications_retry.exceptions import PermanentProviderError
from notifications_retry.models import ChannelConfig, NotificationEntity
from notifications_retry.providers.base import ChannelSettings, OutgoingMessage
from notifications_retry.providers.webhook import WebhookProvider
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.raw_http_server import RawServer, keep_alive
from tests.unit.test_url_policy import STATIC_CORPUS

pytestmark = pytest.mark.django_db

#: Public-looking names and what the fake DNS answers for them.
FAKE_DNS = {
    "loopback.example.com": "127.0.0.1",
    "private.example.com": "10.0.0.7",
    "metadata.example.com": "169.254.169.254",
    "shared.example.com": "100.64.0.9",
    "mapped.example.com": "::ffff:127.0.0.1",
}
CORPUS = {**STATIC_CORPUS, "resolves-inside": list(FAKE_DNS)}
#: Spellings of this machine's loopback (where the receiver listens) that the client connects to.
LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "１２７．０．０．１",
    "[::ffff:127.0.0.1]",
    "0.0.0.0",
    "0x7f.1",
    "0x7f000001",
]
#: Legacy numeric spellings aiohttp itself refuses to connect to, allowlisted or not.
NON_CANONICAL = ["2130706433", "0177.0.0.1", "127.1", "127.0.0.1."]


@pytest.fixture(autouse=True)
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def getaddrinfo(
        host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name in FAKE_DNS:
            address = FAKE_DNS[name]
            if ":" in address:
                return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, int(port or 0), 0, 0))]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]
        return real(host, port, family, type, proto, flags)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def receiver() -> Iterator[RawServer]:
    with RawServer(keep_alive()) as server:
        yield server


def url(host: str, port: int) -> str:
    return f"http://{host}:{port}/hook"


def message() -> OutgoingMessage:
    return OutgoingMessage(uuid.uuid4(), None, "hook", "+33600000000", {"n": 1}, 1, 5, "transactional")


def provider(target: str) -> WebhookProvider:
    return WebhookProvider(ChannelSettings("hook", "webhook", 2.0, 2, {"url": target}))


@pytest.mark.parametrize("kind", CORPUS)
def test_model_validation_refuses(kind: str) -> None:
    for host in CORPUS[kind]:
        channel = ChannelConfig(key="hook", provider_key="webhook", options={"url": url(host, 8080)})
        with pytest.raises(ValidationError) as info:
            channel.full_clean()
        assert "options" in info.value.message_dict, (kind, host)
        text = " ".join(info.value.message_dict["options"])
        assert "internal address" in text or "local name" in text, (kind, host, text)


@pytest.mark.parametrize("kind", CORPUS)
def test_plain_check_names_every_refused_channel(kind: str) -> None:
    keys = []
    for i, host in enumerate(CORPUS[kind]):
        keys.append(f"bad-{i}")
        ChannelConfig.objects.create(key=keys[-1], provider_key="webhook", options={"url": url(host, 8080)})
    ChannelConfig.objects.create(key="public", provider_key="webhook", options={"url": "https://8.8.8.8/x"})
    messages = [m for m in run_checks() if m.id == "notifications_retry.W002"]  # no --database
    named = {m.obj.key for m in messages}
    assert named == set(keys), (kind, [m.msg for m in messages])
    assert all("internal address" in m.msg or "local name" in m.msg for m in messages)


@pytest.mark.parametrize("kind", CORPUS)
def test_send_is_refused_before_reaching_the_receiver(kind: str, receiver: RawServer) -> None:
    for host in CORPUS[kind]:
        with pytest.raises(PermanentProviderError) as info:
            provider(url(host, receiver.port)).send(message())
        assert info.value.kind == "url_refused", (kind, host, info.value)
        assert not info.value.retriable
    assert receiver.connections == 0


ALLOW_LOCAL = ["127.0.0.0/8", "0.0.0.0", "::ffff:127.0.0.1"]


def test_loopback_spellings_reach_the_receiver_when_allowlisted(receiver: RawServer, settings: Any) -> None:
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ALLOW_LOCAL}
    for host in LOOPBACK_SPELLINGS:
        assert provider(url(host, receiver.port)).send(message()).provider_message_id == "a1", host
    assert len(receiver.requests) == len(LOOPBACK_SPELLINGS)


def test_non_canonical_numeric_hosts_are_never_sent_even_when_allowlisted(
    receiver: RawServer, settings: Any
) -> None:
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ALLOW_LOCAL}
    for host in NON_CANONICAL:
        with pytest.raises(PermanentProviderError) as info:
            provider(url(host, receiver.port)).send(message())
        assert info.value.kind == "invalid_request", (host, info.value)
    assert receiver.connections == 0


def test_a_name_resolving_inside_is_refused_at_connect_time(receiver: RawServer, settings: Any) -> None:
    target = url("loopback.example.com", receiver.port)
    # The URL itself passes the policy (a public-looking name): the connection's address does not.
    settings.NOTIFICATIONS_RETRY = {}
    with pytest.raises(PermanentProviderError) as info:
        provider(target).send(message())
    assert info.value.kind == "url_refused" and "127.0.0.1" in str(info.value)
    assert receiver.connections == 0
    # An address allowlist does not vouch for a name outside the allowlist...
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    with pytest.raises(PermanentProviderError):
        provider(target).send(message())
    assert receiver.connections == 0
    # ...an allowlisted name goes where it resolves.
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["loopback.example.com"]}
    assert provider(target).send(message()).provider_message_id == "a1"
    assert len(receiver.requests) == 1


def test_a_mapped_ipv6_answer_is_refused_even_though_it_would_reach_ipv4_loopback(
    receiver: RawServer,
) -> None:
    with pytest.raises(PermanentProviderError) as info:
        provider(url("mapped.example.com", receiver.port)).send(message())
    assert info.value.kind == "url_refused"
    assert receiver.connections == 0


# -- the worker: a channel made in code ------------------------------------------------------------


def due_row(clock: Any, channel: ChannelConfig) -> NotificationEntity:
    return NotificationFactory(
        channel=channel,
        status=NotificationEntity.Status.FAILED,
        attempts=1,
        next_attempt_at=clock.now() - timedelta(seconds=5),
    )


def tick(clock: Any) -> Any:
    worker = Worker(clock=clock, rng=random.Random(7))
    try:
        return worker.tick()
    finally:
        worker.close()


def test_worker_never_calls_an_internal_url_made_in_code_until_it_is_allowlisted(
    clock: Any, receiver: RawServer, settings: Any
) -> None:
    settings.NOTIFICATIONS_RETRY = {}
    # Created in code, as the README's data-migration route does: no validation on the way in.
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": url("127.0.0.1", receiver.port)}
    )
    row = due_row(clock, channel)
    tick(clock)
    row.refresh_from_db()
    assert receiver.connections == 0
    assert (row.status, row.attempts) == (NotificationEntity.Status.FAILED, 1)  # set aside, not spent
    messages = [m.msg for m in run_checks() if m.id == "notifications_retry.W002"]
    assert any("'hook'" in m and "internal address" in m for m in messages)

    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    tick(clock)
    row.refresh_from_db()
    assert row.status == NotificationEntity.Status.SENT and row.provider_message_id == "a1"
    assert len(receiver.requests) == 1


def test_worker_refuses_a_name_that_resolves_inside_as_a_permanent_failure(
    clock: Any, receiver: RawServer, settings: Any
) -> None:
    settings.NOTIFICATIONS_RETRY = {}
    channel = ChannelFactory(
        key="hook", provider_key="webhook", options={"url": url("loopback.example.com", receiver.port)}
    )
    row = due_row(clock, channel)
    tick(clock)
    row.refresh_from_db()
    assert receiver.connections == 0
    assert row.error_kind == "url_refused" and row.dead_lettered_at is not None
