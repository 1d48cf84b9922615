"""Read-only lists: the triage audit (dead-letter actions) and the workers' heartbeats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from notifications_retry.models import DeadLetterAction, WorkerHeartbeat

from .display import timestamp_display
from .filters import DateRangeFilter

if TYPE_CHECKING:
    AuditAdminBase = admin.ModelAdmin[DeadLetterAction]
    HeartbeatAdminBase = admin.ModelAdmin[WorkerHeartbeat]
else:
    AuditAdminBase = HeartbeatAdminBase = admin.ModelAdmin


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(DeadLetterAction)
class DeadLetterActionAdmin(ReadOnlyMixin, AuditAdminBase):
    list_display = ("created_at_display", "action", "actor", "notification_id", "attempts_before", "reason")
    list_filter = ("action", ("created_at", DateRangeFilter))
    search_fields = ("actor",)
    ordering = ("-created_at",)
    fields = ("created_at_display", "action", "actor", "notification", "attempts_before", "reason")
    readonly_fields = fields
    created_at_display = timestamp_display("created_at")

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyMixin, HeartbeatAdminBase):
    list_display = (
        "lane",
        "hostname",
        "pid",
        "last_tick_started_at_display",
        "last_tick_completed_at_display",
    )
    fields = (
        "lane",
        "hostname",
        "pid",
        "last_tick_started_at_display",
        "last_tick_completed_at_display",
        "last_tick_stats",
    )
    readonly_fields = fields
    last_tick_started_at_display = timestamp_display("last_tick_started_at")
    last_tick_completed_at_display = timestamp_display("last_tick_completed_at")

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}
