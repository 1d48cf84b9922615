"""Importing the app imports no HTTP client: every web process imports the providers through the
admin, and aiohttp with httpx cost about a quarter of a second to import. A webhook provider loads them
when it is built, so that its first send does not stall the worker's loop."""

from __future__ import annotations

from tests.support.processes import fresh_interpreter

HTTP_LIBRARIES = ("aiohttp", "httpx")

PROBE = """
import sys
import django
django.setup()
import notifications_retry.admin, notifications_retry.providers
from notifications_retry.providers import get_provider_class
from notifications_retry.conf.channel_settings import ChannelSettings
print(sorted(m for m in {libraries!r} if m in sys.modules))
get_provider_class("webhook")(ChannelSettings("hook", "webhook", 5.0, 4, {{"url": "https://hooks.example/in"}}))
print(sorted(m for m in {libraries!r} if m in sys.modules))
"""


def test_the_app_imports_no_http_client_until_a_webhook_provider_is_built() -> None:
    before, after = fresh_interpreter(PROBE.format(libraries=HTTP_LIBRARIES)).split("\n")[:2]
    assert before == "[]"
    assert after == str(sorted(HTTP_LIBRARIES))


COMMAND_PROBE = """
import sys
import django
django.setup()
from django.core.management import load_command_class
load_command_class("notifications_retry", "retry_worker")
print("django.test" in sys.modules)
"""


def test_the_worker_command_imports_no_test_utilities() -> None:
    """The command silences one check itself: ``override_settings`` would import ``django.test``."""
    assert fresh_interpreter(COMMAND_PROBE).strip() == "False"
