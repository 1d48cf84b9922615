"""Options of a ``django_email`` channel for the running Django version.

Django 6.1 builds email connections from the ``MAILERS`` setting and deprecates
``mail.get_connection()``; the provider takes ``options["mailer"]`` there and ``options["backend"]``
before. Tests say which backend class and keyword arguments they want; the fixture writes them in the
form this version takes (on 6.1 a ``MAILERS`` entry for the test's duration).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import django
from django.core.mail.backends.base import BaseEmailBackend

#: Whether the running Django builds connections from MAILERS.
USES_MAILERS = django.VERSION[:2] >= (6, 1)

MailerOptions = Callable[..., dict[str, Any]]


def mailer_options_for(settings: Any) -> MailerOptions:
    """``make(backend, backend_options, **extra)``: a channel's options sending through that backend.

    ``settings`` is pytest-django's fixture: a MAILERS entry it adds lasts as long as the test.
    """

    def make(backend: str, backend_options: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        if not USES_MAILERS:
            return {"backend": backend, "backend_options": dict(backend_options or {}), **extra}
        mailers = dict(settings.MAILERS)
        alias = f"test-mailer-{len(mailers)}"
        mailers[alias] = {"BACKEND": backend, "OPTIONS": dict(backend_options or {})}
        settings.MAILERS = mailers
        return {"mailer": alias, **extra}

    return make


class CountingBackend(BaseEmailBackend):
    """A backend that counts how often it is built (a check must build only anymail's)."""

    built = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).built += 1
        super().__init__(*args, **kwargs)
