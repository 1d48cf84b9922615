"""The suppression list (search, add, remove: every change audited), its audit, and ESP delivery statuses.

Adding and removing go through :mod:`notifications_retry.delivery.suppression`, the service the API
uses: the address is normalized, an address already on the list is extended, and each change writes a
``SuppressionChange`` row naming the user (beside the admin's own ``LogEntry``). Entries are never
edited in place: remove one and add it again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from notifications_retry.delivery import suppression as service
from notifications_retry.models import (
    ALL_CHANNELS,
    ChannelConfig,
    DeliveryStatus,
    Suppression,
    SuppressionChange,
)
from notifications_retry.observability.masking import mask_recipient

from .display import timestamp_display
from .read_only import ReadOnlyMixin

if TYPE_CHECKING:
    SuppressionAdminBase = admin.ModelAdmin[Suppression]
    ChangeAdminBase = admin.ModelAdmin[SuppressionChange]
    StatusAdminBase = admin.ModelAdmin[DeliveryStatus]
else:
    SuppressionAdminBase = ChangeAdminBase = StatusAdminBase = admin.ModelAdmin


def _channel_choices() -> list[tuple[str, str]]:
    keys = ChannelConfig.objects.order_by("key").values_list("key", flat=True)
    return [(ALL_CHANNELS, "* (every channel)"), *((key, key) for key in keys)]


class SuppressionForm(forms.ModelForm):  # type: ignore[type-arg]
    """What an operator types to add a suppression; the note goes to the audit."""

    channel = forms.ChoiceField(choices=_channel_choices)
    note = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), help_text="Why (audited)."
    )

    class Meta:
        model = Suppression
        fields = ("address", "channel", "reason", "expires_at")
        help_texts = {
            "address": "An email address (compared without case), a phone number or any other recipient.",
            "expires_at": "Empty: as SUPPRESSION_RETENTION_DAYS says for the reason (by default, never).",
        }

    def clean_address(self) -> str:
        value = str(self.cleaned_data.get("address") or "").strip()
        if not value:
            raise forms.ValidationError("Type the recipient to suppress.")
        return value


@admin.register(Suppression)
class SuppressionAdmin(SuppressionAdminBase):
    """Search by address or source; add through the service (audited); remove (audited); never edit."""

    form = SuppressionForm
    list_display = (
        "address",
        "channel",
        "reason",
        "source",
        "events",
        "last_event_at_display",
        "expires_at_display",
    )
    list_filter = ("reason", "channel")
    search_fields = ("address", "source")
    ordering = ("-last_event_at",)
    #: What an entry's page shows (it is never edited: every field read only, times in the admin's format).
    shown_fields = (
        "address",
        "channel",
        "reason",
        "source",
        "detail",
        "first_event_at_display",
        "last_event_at_display",
        "events",
        "expires_at_display",
    )
    readonly_fields = shown_fields
    first_event_at_display = timestamp_display("first_event_at")
    last_event_at_display = timestamp_display("last_event_at")
    expires_at_display = timestamp_display("expires_at")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        # The add form asks what an operator types; an entry's page shows what the list holds.
        if obj is None:
            return ("address", "channel", "reason", "expires_at", "note")
        return self.shown_fields

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.shown_fields

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # An address typed as the list stores it finds its entries however its domain was cased.
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            queryset |= self.model.objects.filter(address=service.normalize_recipient(term))
        return queryset, duplicates

    def save_model(self, request: HttpRequest, obj: Suppression, form: Any, change: bool) -> None:
        added = service.add(
            form.cleaned_data["address"],
            channel=form.cleaned_data["channel"],
            reason=form.cleaned_data["reason"],
            actor=request.user.get_username(),
            note=form.cleaned_data.get("note") or "",
            expires_at=form.cleaned_data.get("expires_at"),
            now=timezone.now(),
        )
        obj.pk = added.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: Suppression) -> None:
        service.remove_entries([obj.pk], actor=request.user.get_username(), now=timezone.now())

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        pks = list(queryset.values_list("pk", flat=True))
        service.remove_entries(pks, actor=request.user.get_username(), now=timezone.now())


@admin.register(SuppressionChange)
class SuppressionChangeAdmin(ReadOnlyMixin, ChangeAdminBase):
    """Who added or removed which suppression, and why."""

    list_display = ("created_at_display", "action", "address", "channel", "reason", "actor", "note")
    list_filter = ("action",)
    search_fields = ("address", "actor")
    ordering = ("-created_at",)
    fields = ("created_at_display", "action", "address", "channel", "reason", "actor", "note")
    readonly_fields = fields
    created_at_display = timestamp_display("created_at")

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}


@admin.register(DeliveryStatus)
class DeliveryStatusAdmin(ReadOnlyMixin, StatusAdminBase):
    """What the ESPs reported about Sent notifications: the state, when, and each state's time."""

    list_display = (
        "notification_link",
        "state",
        "state_at_display",
        "esp",
        "masked_recipient",
        "updated_at_display",
    )
    list_filter = ("state", "esp")
    ordering = ("-updated_at",)
    list_select_related = ("notification",)
    fields = (
        "notification_link",
        "masked_recipient",
        "state",
        "state_at_display",
        "esp",
        "delivered_at_display",
        "opened_at_display",
        "bounced_at_display",
        "complained_at_display",
        "updated_at_display",
    )
    readonly_fields = fields
    state_at_display = timestamp_display("state_at", "state at")
    delivered_at_display = timestamp_display("delivered_at")
    opened_at_display = timestamp_display("opened_at")
    bounced_at_display = timestamp_display("bounced_at")
    complained_at_display = timestamp_display("complained_at")
    updated_at_display = timestamp_display("updated_at")

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}

    @admin.display(description="notification")
    def notification_link(self, obj: DeliveryStatus) -> SafeString:
        url = reverse("admin:notifications_retry_notificationentity_change", args=[obj.notification_id])
        return format_html('<a href="{}">{}</a>', url, str(obj.notification_id)[:8])

    @admin.display(description="recipient")
    def masked_recipient(self, obj: DeliveryStatus) -> str:
        return mask_recipient(obj.notification.recipient)
