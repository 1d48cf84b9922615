"""The channel admin's endpoint health: the state column, the change log, the audited re-enable action.

An automatically disabled channel comes back only through :func:`delivery.health.reenable` (the
action below): audited, refused during the cooldown, the window started afresh. The plain enable
action, the list's checkbox and the edit form refuse to turn such a channel on behind its back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.safestring import SafeString

from notifications_retry.delivery import health
from notifications_retry.exceptions import InvalidTransition
from notifications_retry.models import ChannelConfig
from notifications_retry.rules.endpoint_health import DISABLED

from .display import fragment

if TYPE_CHECKING:
    HealthAdminBase = admin.ModelAdmin[ChannelConfig]
else:
    HealthAdminBase = admin.ModelAdmin

REENABLE_HINT = "it was disabled by its health check: use the action 'Re-enable after an automatic disable'"


def refuse_silent_reenable(instance: ChannelConfig, cleaned: dict[str, Any]) -> None:
    """A form's check: turning ``is_enabled`` on for a health-disabled channel goes through the action."""
    if instance.pk is not None and instance.health_state == DISABLED and cleaned.get("is_enabled"):
        raise ValidationError({"is_enabled": f"Not enabled: {REENABLE_HINT}."})


class HealthGuardedListForm(forms.ModelForm):  # type: ignore[type-arg]
    """The changelist's editable row: the same refusal as the edit form."""

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        refuse_silent_reenable(self.instance, data)
        return data


class ChannelHealthAdmin(HealthAdminBase):
    """What the channel admin adds for endpoint health."""

    @admin.display(description="endpoint health", ordering="health_state")
    def endpoint_health(self, obj: ChannelConfig) -> SafeString:
        return fragment(
            "endpoint_health", state=obj.health_state, reason=obj.health_reason, at=obj.health_changed_at
        )

    @admin.display(description="health changes")
    def health_log_display(self, obj: ChannelConfig) -> SafeString | str:
        if obj.pk is None:
            return "—"
        changes = list(obj.health_log.all()[:20])
        return fragment("health_log", changes=changes) if changes else "No change recorded."

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        return super().get_changelist_form(request, form=HealthGuardedListForm, **kwargs)

    @admin.action(description="Re-enable after an automatic disable (audited)", permissions=["change"])
    def reenable_channels(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        actor = request.user.get_username()
        done = 0
        for channel in queryset.order_by("key"):
            try:
                health.reenable(channel.pk, actor=actor, reason="admin action", now=timezone.now())
            except InvalidTransition as exc:
                self.message_user(request, f"{channel.key}: {exc}", messages.WARNING)
                continue
            self.log_change(request, channel, "Re-enabled after an automatic disable.")
            done += 1
        if done:
            self.message_user(request, f"Re-enabled {done} channel(s).", messages.SUCCESS)
