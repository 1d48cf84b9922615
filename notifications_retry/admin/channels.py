"""Channels: the list (enable, disable, whether each can send) and the edit form with a write-only secret."""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from notifications_retry.inputs.url_policy import resolved_beforehand, webhook_url_problems
from notifications_retry.models import ChannelConfig
from notifications_retry.providers import channel_warnings, webhook
from notifications_retry.rules.endpoint_health import DISABLED

from . import display
from .channel_health import REENABLE_HINT, ChannelHealthAdmin, refuse_silent_reenable
from .display import format_age, fragment


class ChannelConfigForm(forms.ModelForm):  # type: ignore[type-arg]
    """Options without the secrets (write-only fields beside them), webhook URLs checked by the URL policy.

    Stored secrets are listed masked (kind and fingerprint, :func:`webhook.masked`), each with a
    box to remove it: a rotation adds the new ``whsec_`` secret, waits for the receiver, then removes the
    old one, and both sign meanwhile.
    """

    secret = forms.CharField(
        required=False,
        strip=False,
        label="Provider secret",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    add_secret = forms.CharField(
        required=False,
        strip=True,
        label="Add a signing secret (rotation)",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    remove_secrets = forms.MultipleChoiceField(
        required=False, label="Stored secrets (tick to remove)", widget=forms.CheckboxSelectMultiple
    )
    clear_secret = forms.BooleanField(required=False, label="Remove every stored secret")

    class Meta:
        model = ChannelConfig
        fields = (
            "key",
            "is_enabled",
            "provider_key",
            "max_attempts",
            "retry_backoff",
            "backoff_base_seconds",
            "backoff_cap_seconds",
            "timeout_seconds",
            "rate_limit_per_second",
            "max_concurrency",
            "options",
            "fallback",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = dict(self.instance.options or {}) if isinstance(self.instance.options, dict) else {}
        self.stored_secret: str | None = options.pop("secret", None)
        stored_many = options.pop("secrets", None)
        self.stored_secrets: list[str] = list(stored_many) if isinstance(stored_many, list) else []
        self.initial["options"] = options
        stored = webhook.stored_secrets({"secret": self.stored_secret, "secrets": self.stored_secrets})
        self.fields["remove_secrets"].choices = [  # type: ignore[attr-defined]
            (webhook.fingerprint(s), webhook.masked(s)) for s in stored
        ]
        legacy = self.stored_secret is not None and not webhook.is_standard(self.stored_secret)
        self.fields["secret"].help_text = (
            "A secret is stored (never shown). Type a new one to replace it, or leave empty to keep it."
            if self.stored_secret
            else "No secret stored. Type one to set it; it is never shown again."
        ) + (
            " It signs with the legacy X-Signature header (no timestamp, no rotation): Standard Webhooks "
            "is recommended, add a whsec_ secret below, move the receiver to it, then remove this one."
            if legacy
            else ""
        )
        self.fields["add_secret"].help_text = (
            "A whsec_ secret (Standard Webhooks) signing beside the stored ones, for a rotation without "
            f"downtime. A fresh one to use: {_suggested_secret()}"
        )
        if "fallback" in self.fields and self.instance.pk is not None:
            # Offering the channel itself would only lead to an error (clean() refuses it).
            field = self.fields["fallback"]
            field.queryset = ChannelConfig.objects.exclude(pk=self.instance.pk)  # type: ignore[attr-defined]
        self.fields["options"].help_text = (
            'Provider options as JSON, e.g. {"url": "https://hooks.example.com/notify"}. '
            "Secrets go in their own fields below."
        )

    def clean_options(self) -> dict[str, Any]:
        value = self.cleaned_data.get("options")
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise ValidationError("Options must be a JSON object.")
        if "secret" in value or "secrets" in value:
            raise ValidationError(
                "Put secrets in the Provider secret fields: options never hold them in clear."
            )
        return value

    def clean_secret(self) -> str:
        value: str = self.cleaned_data.get("secret") or ""
        if value and webhook.secret_problems({"secret": value}):
            raise ValidationError("Not a valid whsec_ secret: base64 of 24 to 64 bytes after whsec_.")
        return value

    def clean_add_secret(self) -> str:
        value: str = self.cleaned_data.get("add_secret") or ""
        if value and webhook.secret_problems({"secrets": [value]}):
            raise ValidationError(
                "A secret added beside others is a whsec_ secret (base64 of 24 to 64 bytes)."
            )
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            refuse_silent_reenable(self.instance, data)
        except ValidationError as exc:
            self.add_error(None, exc)
        if "options" not in data:
            return data
        options = dict(data["options"])
        single, many = self.stored_secret, list(self.stored_secrets)
        if data.get("clear_secret"):
            single, many = None, []
        removed = set(data.get("remove_secrets") or ())
        if single is not None and webhook.fingerprint(single) in removed:
            single = None
        many = [s for s in many if webhook.fingerprint(s) not in removed]
        if data.get("secret"):
            single = data["secret"]
        if data.get("add_secret") and data["add_secret"] not in many:
            many.append(data["add_secret"])
        if single:
            options["secret"] = single
        if many:
            options["secrets"] = many
        data["options"] = options
        url = options.get("url")
        if url is not None or data.get("provider_key") == "webhook":
            for problem in webhook_url_problems(url if isinstance(url, str) else ""):
                self.add_error("options", problem)
        return data

    def _post_clean(self) -> None:
        # The model's clean() checks the options the instance holds. Once the posted options were
        # refused (bad JSON, a malformed URL), the instance still holds the stored ones (none, on a new
        # channel), and their problems ("webhook channel needs options['url']") are not what was posted.
        refused = self.errors["options"].copy() if "options" in self.errors else None
        super()._post_clean()  # type: ignore[misc]  # ModelForm's hook, absent from django-stubs
        if refused is not None:
            self.errors["options"] = refused


def _suggested_secret() -> str:
    """A new Standard Webhooks secret (32 random bytes): what the admin offers in place of a legacy one."""
    return webhook.PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


@admin.register(ChannelConfig)
class ChannelConfigAdmin(ChannelHealthAdmin):
    form = ChannelConfigForm
    # Whether each channel can send comes second, so a broken one shows on a 1,440 px screen; the limits
    # are summarised in two columns (each field is on the edit page).
    # The "configuration" column also shows the endpoint's health when it is not ok (7 columns fit).
    list_display = ("key", "health", "is_enabled", "provider_key", "retries", "limits", "secret_display")
    list_display_links = ("key",)
    list_editable = ("is_enabled",)
    list_filter = ("is_enabled", "provider_key", "retry_backoff")
    search_fields = ("key", "provider_key")
    readonly_fields = (
        "problems_display",
        "endpoint_health",
        "health_reason",
        "health_changed_at_display",
        "health_log_display",
        "created_at_display",
        "updated_at_display",
    )
    # The admin's one timestamp format, with its zone (not Django's DATETIME_FORMAT).
    created_at_display = display.timestamp_display("created_at", "created at")
    updated_at_display = display.timestamp_display("updated_at", "updated at")
    health_changed_at_display = display.timestamp_display("health_changed_at", "health changed at")
    actions = ("enable_channels", "disable_channels", "reenable_channels")
    fieldsets = (
        (None, {"fields": ("key", "is_enabled", "provider_key", "problems_display")}),
        (
            "Retries",
            {"fields": ("max_attempts", "retry_backoff", "backoff_base_seconds", "backoff_cap_seconds")},
        ),
        ("Limits", {"fields": ("timeout_seconds", "rate_limit_per_second", "max_concurrency")}),
        ("Provider", {"fields": ("options", "secret", "add_secret", "remove_secrets", "clear_secret")}),
        ("Failover", {"fields": ("fallback",)}),
        (
            "Endpoint health",
            {
                "fields": (
                    "endpoint_health",
                    "health_reason",
                    "health_changed_at_display",
                    "health_log_display",
                )
            },
        ),
        ("Dates", {"fields": ("created_at_display", "updated_at_display")}),
    )

    class Media:
        css = {"all": ("notifications_retry/admin.css",)}

    @admin.display(description="retries", ordering="max_attempts")
    def retries(self, obj: ChannelConfig) -> str:
        base, cap = format_age(obj.backoff_base_seconds), format_age(obj.backoff_cap_seconds)
        delays = base if obj.retry_backoff == ChannelConfig.Backoff.FIXED else f"{base} to {cap}"
        return f"{obj.max_attempts} attempts, {obj.get_retry_backoff_display().lower()} {delays}"

    @admin.display(description="limits")
    def limits(self, obj: ChannelConfig) -> str:
        rate = f"{obj.rate_limit_per_second:g}/s" if obj.rate_limit_per_second else "no rate limit"
        return f"timeout {obj.timeout_seconds:g}s, {rate}, {obj.max_concurrency} at once"

    @admin.display(description="secret")
    def secret_display(self, obj: ChannelConfig) -> str:
        stored = webhook.stored_secrets(obj.options) if isinstance(obj.options, dict) else []
        if not stored:
            return "—"
        standard = sum(webhook.is_standard(s) for s in stored)
        kinds = [f"{standard} whsec_"] if standard else []
        if len(stored) > standard:
            kinds.append("legacy X-Signature")
        return f"•••••• (set) {', '.join(kinds)}"

    @admin.display(description="configuration")
    def health(self, obj: ChannelConfig) -> SafeString:
        problems = obj.configuration_problems()
        # A channel without problems can still fail every send: an ESP's credentials missing (W008).
        warnings = [] if problems else channel_warnings(obj.provider_key, obj.options)
        configuration = fragment("channel_health", problems=problems, warnings=warnings)
        if obj.health_state == "ok":
            return configuration
        return format_html("{}<br>{}", configuration, self.endpoint_health(obj))

    @admin.display(description="configuration problems")
    def problems_display(self, obj: ChannelConfig) -> str:
        if obj.pk is None:
            return "—"
        problems = obj.configuration_problems()
        if problems:
            return "; ".join(problems)
        warnings = channel_warnings(obj.provider_key, obj.options)
        if warnings:
            return "every send will fail: " + "; ".join(warnings)
        return "none: the channel can send"

    @admin.action(description="Enable selected channels", permissions=["change"])
    def enable_channels(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected channels (rows wait untouched)", permissions=["change"])
    def disable_channels(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Any], enabled: bool) -> None:
        changed = list(queryset.exclude(is_enabled=enabled))
        if enabled:
            for channel in [c for c in changed if c.health_state == DISABLED]:
                self.message_user(request, f"{channel.key} not enabled: {REENABLE_HINT}.", messages.WARNING)
            changed = [c for c in changed if c.health_state != DISABLED]
        ChannelConfig.objects.filter(pk__in=[c.pk for c in changed]).update(
            is_enabled=enabled, updated_at=timezone.now()
        )
        for channel in changed:
            self.log_change(request, channel, "Enabled." if enabled else "Disabled.")
        verb = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{verb} {len(changed)} channel(s).", messages.SUCCESS)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # Django validates a posted form inside the transaction it saves in, and the model's clean()
        # looks a webhook's host name up: a network call, so it is made here, before that opens.
        with resolved_beforehand(_posted_urls(request)):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and not self.has_change_permission(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)


def _posted_urls(request: HttpRequest) -> list[object]:
    """The webhook URL a posted channel form carries, if any (what the model's clean() resolves)."""
    if request.method != "POST":
        return []
    try:
        options = json.loads(request.POST.get("options") or "null")
    except ValueError:
        return []  # the form reports it
    return [options.get("url")] if isinstance(options, dict) else []
