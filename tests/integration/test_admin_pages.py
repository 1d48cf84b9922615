"""The admin's channel, outbox and dashboard pages (the notification pages are in test_admin.py)."""

from __future__ import annotations

import base64
import re
import socket
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connections
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from notifications_retry.admin import backlog_chart, format_age
from notifications_retry.models import BacklogSample, ChannelConfig, WorkerHeartbeat
from tests.factories import ChannelFactory, NotificationFactory
from tests.support.admin_pages import (  # noqa: F401  (admin_user is a fixture)
    CHANGELIST,
    DASHBOARD,
    action,
    admin_user,
    dead_letter,
    ids_in,
    outbox_event,
    staff,
)

pytestmark = pytest.mark.django_db

# --- channels ------------------------------------------------------------------------------------------


def channel_form(channel: ChannelConfig, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "key": channel.key,
        "is_enabled": "on" if channel.is_enabled else "",
        "provider_key": channel.provider_key,
        "max_attempts": channel.max_attempts,
        "retry_backoff": channel.retry_backoff,
        "backoff_base_seconds": channel.backoff_base_seconds,
        "backoff_cap_seconds": channel.backoff_cap_seconds,
        "timeout_seconds": channel.timeout_seconds,
        "rate_limit_per_second": "",
        "max_concurrency": channel.max_concurrency,
        "options": "{}",
        "secret": "",
    }
    data.update(changes)
    return data


def test_channel_enable_disable_from_the_list(admin_client: Client) -> None:
    a = ChannelFactory(key="sms", is_enabled=True)
    b = ChannelFactory(key="push", is_enabled=True)
    url = reverse("admin:notifications_retry_channelconfig_changelist")
    response = admin_client.post(
        url, {"action": "disable_channels", "_selected_action": [a.pk, b.pk], "index": 0}
    )
    assert response.status_code == 302
    assert not ChannelConfig.objects.filter(is_enabled=True).exists()
    assert LogEntry.objects.filter(object_id=str(a.pk), change_message="Disabled.").exists()
    # list_editable
    data = {
        "form-TOTAL_FORMS": "2",
        "form-INITIAL_FORMS": "2",
        "form-0-id": b.pk,
        "form-0-is_enabled": "on",
        "form-1-id": a.pk,
        "_save": "Save",
    }
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.content
    b.refresh_from_db()
    a.refresh_from_db()
    assert b.is_enabled and not a.is_enabled


def test_webhook_url_policy_in_the_channel_form(admin_client: Client, settings: Any) -> None:
    channel = ChannelFactory(
        key="webhook", provider_key="webhook", options={"url": "https://hooks.example.com/x"}
    )
    url = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    for bad in (
        "http://169.254.169.254/latest/meta-data",
        "http://127.0.0.1:8000/",
        "ftp://hooks.example.com/",
        "http://localhost/",
    ):
        response = admin_client.post(url, channel_form(channel, options=f'{{"url": "{bad}"}}'))
        assert response.status_code == 200, bad
        assert response.context["adminform"].form.errors["options"], bad
    channel.refresh_from_db()
    assert channel.options == {"url": "https://hooks.example.com/x"}
    settings.NOTIFICATIONS_RETRY = {"WEBHOOK_ALLOWED_HOSTS": ["127.0.0.1"]}
    response = admin_client.post(url, channel_form(channel, options='{"url": "http://127.0.0.1:8000/hook"}'))
    assert response.status_code == 302
    channel.refresh_from_db()
    assert channel.options == {"url": "http://127.0.0.1:8000/hook"}
    response = admin_client.post(
        url, channel_form(channel, options='{"url": "https://elsewhere.example.org/"}')
    )
    assert "not in WEBHOOK_ALLOWED_HOSTS" in str(response.context["adminform"].form.errors)


@pytest.mark.django_db(transaction=True)
def test_the_channel_form_looks_a_webhook_host_up_before_its_transaction_opens(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Model validation refuses a name that resolves inside. The admin validates and saves in one
    # transaction, and a DNS lookup is a network call: it must be made before that transaction opens.
    open_during_lookup: list[bool] = []
    # The view runs on this thread, the lookup on one of its own: keep this thread's connection.
    request_connection = connections["default"]
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "sneaky.example.com":
            open_during_lookup.append(request_connection.in_atomic_block)
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("10.0.0.7", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    channel = ChannelFactory(
        key="webhook", provider_key="webhook", options={"url": "https://hooks.example.com/x"}
    )
    url = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    response = admin_client.post(
        url, channel_form(channel, options='{"url": "https://sneaky.example.com/x"}')
    )
    assert response.status_code == 200
    assert "resolves to internal address(es) 10.0.0.7" in str(response.context["adminform"].form.errors)
    assert open_during_lookup == [False]
    channel.refresh_from_db()
    assert channel.options == {"url": "https://hooks.example.com/x"}


def test_channel_limits_are_validated(admin_client: Client) -> None:
    channel = ChannelFactory(key="email")
    url = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    response = admin_client.post(url, channel_form(channel, backoff_base_seconds=600, backoff_cap_seconds=60))
    assert response.status_code == 200
    assert "backoff_cap_seconds" in response.context["adminform"].form.errors
    response = admin_client.post(url, channel_form(channel, provider_key="no-such-provider"))
    assert "provider_key" in response.context["adminform"].form.errors


def test_provider_secret_is_write_only(admin_client: Client) -> None:
    channel = ChannelFactory(
        key="webhook",
        provider_key="webhook",
        options={"url": "https://hooks.example.com/x", "secret": "s3cr3t-value"},
    )
    url = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    form_page = admin_client.get(url)
    assert form_page.status_code == 200
    assert b"s3cr3t-value" not in form_page.content
    listing = admin_client.get(reverse("admin:notifications_retry_channelconfig_changelist"))
    assert listing.status_code == 200
    assert b"s3cr3t-value" not in listing.content and b"(set)" in listing.content
    options = '{"url": "https://hooks.example.com/y"}'
    assert admin_client.post(url, channel_form(channel, options=options)).status_code == 302
    channel.refresh_from_db()
    assert channel.options == {"url": "https://hooks.example.com/y", "secret": "s3cr3t-value"}  # kept
    assert admin_client.post(url, channel_form(channel, options=options, secret="n3w")).status_code == 302
    channel.refresh_from_db()
    assert channel.options["secret"] == "n3w"
    refused = admin_client.post(
        url, channel_form(channel, options='{"url": "https://a.example.com", "secret": "x"}')
    )
    assert refused.status_code == 200 and "options" in refused.context["adminform"].form.errors
    assert (
        admin_client.post(url, channel_form(channel, options=options, clear_secret="on")).status_code == 302
    )
    channel.refresh_from_db()
    assert "secret" not in channel.options


# --- outbox, dashboard ---------------------------------------------------------------------------------


def test_outbox_is_read_only_with_published_filter(admin_client: Client) -> None:
    row = dead_letter()
    pending = outbox_event(row)
    published = outbox_event(NotificationFactory(status="sent"), published=True)
    url = reverse("admin:notifications_retry_outbox_changelist")
    assert ids_in(admin_client.get(url + "?published=no")) == {str(pending.pk)}
    assert ids_in(admin_client.get(url + "?published=yes")) == {str(published.pk)}
    assert ids_in(admin_client.get(url, {"q": str(row.pk)})) == {str(pending.pk)}
    detail = admin_client.get(reverse("admin:notifications_retry_outbox_change", args=[pending.pk]))
    assert detail.status_code == 200 and b'name="_save"' not in detail.content
    assert b"&quot;status&quot;: &quot;Failed&quot;" in detail.content
    assert admin_client.get(reverse("admin:notifications_retry_outbox_add")).status_code == 403


def test_dashboard_counts_chart_and_links(admin_client: Client) -> None:
    now = timezone.now()
    dead_letter(error_kind="http_4xx")
    dead_letter(error_kind="http_4xx")
    dead_letter(error_kind="invalid_address", dead_lettered_at=now - timedelta(days=2))
    NotificationFactory(status="failed", attempts=1, next_attempt_at=now - timedelta(minutes=3))
    NotificationFactory(status="sent")
    for i in range(30):
        BacklogSample.objects.create(
            taken_at=now - timedelta(minutes=40 * i),
            due_backlog=i % 7,
            failed_backlog=i % 3,
            dead_letters_unresolved=3,
        )
    WorkerHeartbeat.objects.create(lane="default", hostname="w1", pid=7, last_tick_completed_at=now)
    response = admin_client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    ctx = response.context
    assert ctx["backlog"].due == 1 and ctx["backlog"].dead_letters_unresolved == 3
    assert ctx["terminal_total"] == 2 and ctx["terminal"][0]["error_kind"] == "http_4xx"
    html = response.content.decode()
    assert "<svg" in html and html.count("<polyline") == 3
    assert "?dead_letter=unresolved" in html and "queue=due" in html
    assert ctx["chart"].samples == 30
    # every link into the list opens a working filtered list
    for link in (
        ctx["links"]["dead_unresolved"],
        ctx["links"]["due"],
        ctx["terminal"][0]["url"],
        ctx["breakdown"][0]["url"],
    ):
        assert admin_client.get(link).status_code == 200, link
    assert len(ids_in(admin_client.get(ctx["terminal"][0]["url"]))) == 2


def test_dashboard_without_samples_says_so(admin_client: Client) -> None:
    response = admin_client.get(reverse(DASHBOARD))
    assert response.status_code == 200
    assert b"No backlog samples in the last 24 hours" in response.content


def test_backlog_chart_buckets_and_scales() -> None:
    end = timezone.now()
    start = end - timedelta(hours=24)
    samples = [
        BacklogSample(
            taken_at=start + timedelta(minutes=i),
            due_backlog=i % 50,
            failed_backlog=0,
            dead_letters_unresolved=0,
        )
        for i in range(1440)
    ]
    chart = backlog_chart(samples, start, end, max_points=100)
    due = chart.series[0]["points"].split()
    assert len(due) <= 100 and chart.peak == 49 and chart.samples == 1440
    xs = [float(p.split(",")[0]) for p in due]
    assert xs == sorted(xs) and chart.left <= xs[0] and xs[-1] <= chart.left + chart.plot_width
    assert [t["label"] for t in chart.x_ticks] == ["-24h", "-18h", "-12h", "-6h", "now"]
    assert format_age(59) == "59s" and format_age(3700) == "1h 1m" and format_age(90000) == "1d 1h"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ('{"url": "htp:/broken"}', "the webhook URL must use http or https, not 'htp'"),
        ('{"url": https://hooks.example.com}', "Enter a valid JSON."),
        ('{"url": 5}', "the webhook URL is empty"),
    ],
)
def test_a_malformed_url_on_a_new_channel_gives_its_own_errors_only(
    admin_client: Client, options: str, error: str
) -> None:
    new = ChannelConfig(key="hook", provider_key="webhook", max_concurrency=4)
    response = admin_client.post(
        reverse("admin:notifications_retry_channelconfig_add"), channel_form(new, options=options)
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["options"]
    assert error in errors
    # Not the stored options' problem (a new channel has none): that error was false.
    assert "webhook channel needs options['url']" not in errors, errors
    assert not ChannelConfig.objects.filter(key="hook").exists()


def test_signing_secrets_rotate_from_the_form_and_show_only_masked(admin_client: Client) -> None:
    from notifications_retry.providers.webhook import fingerprint

    old = "whsec_" + base64.b64encode(b"o" * 32).decode()
    new = "whsec_" + base64.b64encode(b"n" * 24).decode()
    channel = ChannelFactory(
        key="hooks", provider_key="webhook", options={"url": "https://hooks.example.com/x", "secret": old}
    )
    url = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    page = admin_client.get(url).content.decode()
    assert old[6:] not in page and fingerprint(old) in page and "Standard Webhooks" in page
    options = '{"url": "https://hooks.example.com/x"}'
    # Step 1: the new secret signs beside the old one.
    assert admin_client.post(url, channel_form(channel, options=options, add_secret=new)).status_code == 302
    channel.refresh_from_db()
    assert channel.options == {"url": "https://hooks.example.com/x", "secret": old, "secrets": [new]}
    page = admin_client.get(url).content.decode()
    assert old[6:] not in page and new[6:] not in page and fingerprint(new) in page
    listing = admin_client.get(reverse("admin:notifications_retry_channelconfig_changelist")).content
    assert b"2 whsec_" in listing and old[6:].encode() not in listing
    # Step 2: the old one removed by its fingerprint; the new one keeps signing.
    removal = channel_form(channel, options=options, remove_secrets=[fingerprint(old)])
    assert admin_client.post(url, removal).status_code == 302
    channel.refresh_from_db()
    assert channel.options == {"url": "https://hooks.example.com/x", "secrets": [new]}


def test_the_form_suggests_the_standard_for_a_legacy_secret_and_refuses_bad_ones(
    admin_client: Client,
) -> None:
    channel = ChannelFactory(
        key="hooks",
        provider_key="webhook",
        options={"url": "https://hooks.example.com/x", "secret": "l3gacy-x"},
    )
    url = reverse("admin:notifications_retry_channelconfig_change", args=[channel.pk])
    page = admin_client.get(url).content.decode()
    assert (
        "l3gacy-x" not in page and "legacy X-Signature" in page and "Standard Webhooks is recommended" in page
    )
    suggestion = re.search(r"whsec_[A-Za-z0-9+/=]{44}", page)
    assert suggestion is not None
    options = '{"url": "https://hooks.example.com/x"}'
    refused = admin_client.post(url, channel_form(channel, options=options, add_secret="not-whsec"))
    assert "add_secret" in refused.context["adminform"].form.errors
    refused = admin_client.post(url, channel_form(channel, options=options, secret="whsec_short"))
    assert "secret" in refused.context["adminform"].form.errors
    in_options = admin_client.post(
        url, channel_form(channel, options='{"url": "https://a.example", "secrets": []}')
    )
    assert "options" in in_options.context["adminform"].form.errors
    accepted = admin_client.post(url, channel_form(channel, options=options, add_secret=suggestion.group(0)))
    assert accepted.status_code == 302
    channel.refresh_from_db()
    assert channel.options["secrets"] == [suggestion.group(0)] and channel.options["secret"] == "l3gacy-x"
