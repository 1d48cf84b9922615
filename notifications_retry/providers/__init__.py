"""Provider registry keyed by ``ChannelConfig.provider_key``.

Built-ins are ``in_app``, ``stub``, ``webhook`` and ``django_email``;
``NOTIFICATIONS_RETRY["PROVIDERS"]`` adds or replaces entries with dotted paths of :class:`Provider`
subclasses.

Modules: :mod:`.base` (the interface), :mod:`.in_app`, :mod:`.stub`, :mod:`.webhook` (with its
signatures: Standard Webhooks and the legacy one) over :mod:`.http_client`, and :mod:`.django_email`
with :mod:`.email_message` (payload to message), :mod:`.email_errors` (failures classified) and
:mod:`.email_evidence` (the SMTP reply or ESP answer of an attempt); :mod:`.http_status` (what an HTTP
answer means, for the webhook and an ESP's API alike).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.utils.module_loading import import_string

from ..conf import get_settings
from ..exceptions import ChannelConfigurationError
from .base import ChannelSettings, OutgoingMessage, Provider, SendResult
from .django_email import DjangoEmailProvider
from .in_app import InAppProvider
from .stub import StubProvider
from .webhook import WebhookProvider

BUILTIN_PROVIDERS: dict[str, type[Provider]] = {
    InAppProvider.key: InAppProvider,
    StubProvider.key: StubProvider,
    WebhookProvider.key: WebhookProvider,
    DjangoEmailProvider.key: DjangoEmailProvider,
}

__all__ = [
    "BUILTIN_PROVIDERS",
    "ChannelSettings",
    "OutgoingMessage",
    "Provider",
    "SendResult",
    "channel_problems",
    "channel_warnings",
    "get_provider_class",
    "payload_problems",
    "registry",
]


def registry() -> dict[str, type[Provider]]:
    """Every provider key known now: built-ins overlaid with the settings' ``PROVIDERS``."""
    providers = dict(BUILTIN_PROVIDERS)
    for key, path in get_settings().PROVIDERS.items():
        try:
            cls = import_string(path)
        except ImportError as exc:
            raise ChannelConfigurationError(f"provider {key!r}: cannot import {path!r}: {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Provider)):
            raise ChannelConfigurationError(f"provider {key!r}: {path!r} is not a Provider subclass")
        providers[key] = cls
    return providers


def get_provider_class(key: str) -> type[Provider]:
    """The provider class for ``key``; a clear error naming the known keys otherwise."""
    providers = registry()
    try:
        return providers[key]
    except KeyError:
        raise ChannelConfigurationError(
            f"unknown provider key {key!r}; known: {', '.join(sorted(providers))}"
        ) from None


def channel_problems(provider_key: str, options: Mapping[str, Any] | Any) -> list[str]:
    """What stops a channel with this provider and these options from sending; empty when it can work.

    The guard every path goes through (system check, admin, the worker's channel load): options come
    from a JSON column that raw SQL can fill with anything, and whatever a provider's check raises on
    them is a problem of that one channel, never an exception that stops the caller.
    """
    try:
        provider = get_provider_class(provider_key)
    except ChannelConfigurationError as exc:
        return [str(exc)]
    try:
        return list(provider.options_problems(options))
    except Exception as exc:
        return [f"{provider_key} options cannot be checked: {type(exc).__name__}: {exc}"]


def channel_warnings(provider_key: str, options: Mapping[str, Any] | Any) -> list[str]:
    """What may stop a valid channel from sending, found outside its options (an ESP's credentials).

    Empty for a channel with problems (:func:`channel_problems` speaks for it). Guarded as that one:
    whatever a provider's check raises is reported as the channel's warning, never raised.
    """
    if channel_problems(provider_key, options):
        return []
    provider = get_provider_class(provider_key)
    try:
        return list(provider.options_warnings(options))
    except Exception as exc:
        return [f"{provider_key} configuration cannot be checked: {type(exc).__name__}: {exc}"]


def payload_problems(provider_key: str, payload: Mapping[str, Any]) -> list[str]:
    """Why a channel with this provider cannot send ``payload``; empty when it can or cannot tell.

    A channel whose provider is unknown is the channel's problem, not the payload's: its rows wait
    until it is fixed, so its payloads are not judged.
    """
    try:
        provider = get_provider_class(provider_key)
    except ChannelConfigurationError:
        return []
    return list(provider.payload_problems(payload))
