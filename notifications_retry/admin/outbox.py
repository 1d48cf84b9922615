"""The outbox, read only: events by publication state, each linked to its notification."""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.safestring import SafeString

from notifications_retry.models import Outbox

from .display import fragment, pretty_json, timestamp_display
from .filters import NEVER_FACETS, DateRangeFilter, PublishedFilter
from .read_only import ReadOnlyMixin

if TYPE_CHECKING:
    OutboxAdminBase = admin.ModelAdmin[Outbox]
else:
    OutboxAdminBase = admin.ModelAdmin


@admin.register(Outbox)
class OutboxAdmin(ReadOnlyMixin, OutboxAdminBase):
    list_display = (
        "id",
        "topic",
        "notification_link",
        "event_status",
        "generation",
        "created_at_display",
        "published_at_display",
    )
    list_filter = (PublishedFilter, "topic", ("created_at", DateRangeFilter))
    search_fields = ("=key",)
    search_help_text = "NotificationId or event id (exact)."
    ordering = ("-id",)
    show_full_result_count = False
    fields = (
        "event_id",
        "topic",
        "notification_link",
        "contract_version",
        "generation",
        "payload_display",
        "created_at_display",
        "published_at_display",
    )
    readonly_fields = fields
    created_at_display = timestamp_display("created_at")
    published_at_display = timestamp_display("published_at")
    show_facets = NEVER_FACETS

    class Media:
        css = {"all": ("notifications_retry/admin.css",)}

    @admin.display(description="notification", ordering="key")
    def notification_link(self, obj: Outbox) -> SafeString | str:
        try:
            pk = uuid.UUID(obj.key)
        except ValueError:
            return obj.key
        url = reverse("admin:notifications_retry_notificationentity_change", args=[pk])
        return fragment("link", url=url, text=obj.key)

    @admin.display(description="status")
    def event_status(self, obj: Outbox) -> str:
        return str(obj.payload.get("status", "")) if isinstance(obj.payload, dict) else ""

    @admin.display(description="payload")
    def payload_display(self, obj: Outbox) -> SafeString:
        return pretty_json(obj.payload)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(key=term)
        with contextlib.suppress(ValueError):
            condition |= Q(event_id=uuid.UUID(term))
        return queryset.filter(condition), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            raise PermissionDenied  # read only: no actions
        return super().changelist_view(request, extra_context)

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}
