"""The notification list and its read-only detail page; triage comes from :class:`TriageActions`."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast, Left, Length
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from notifications_retry.models import DeliveryStatus, NotificationEntity, Outbox
from notifications_retry.observability.masking import mask_recipient

from . import display
from .dashboard import dashboard_view
from .filters import (
    NEVER_FACETS,
    DateRangeFilter,
    DeadLetterFilter,
    ErrorKindFilter,
    QueueStateFilter,
    ResolutionFilter,
    StatusClassFilter,
    TenantFilter,
)
from .recovery import start_url_for_list
from .timeline import timeline
from .triage_actions import BULK_ACTION_CAP, TriageActions

VIEW_RECIPIENT_PERM = f"{NotificationEntity._meta.app_label}.view_recipient"


@admin.register(NotificationEntity)
class NotificationEntityAdmin(TriageActions):
    """Read-only notifications with triage actions; the recipient is masked unless permitted."""

    # What an operator triages by, narrow enough for a 1,440 px screen with both sidebars open: the badge
    # says dead letter / discarded (its tooltip: when); tenant, recipient and dates are on the detail page.
    list_display = (
        "short_id",
        "status_badge",
        "channel",
        "error_kind_display",
        "attempts_display",
        "due_display",
        "age",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        DeadLetterFilter,
        ResolutionFilter,
        QueueStateFilter,
        "channel",
        StatusClassFilter,
        ErrorKindFilter,
        TenantFilter,
        "priority",
        ("created_at", DateRangeFilter),
        ("dead_lettered_at", DateRangeFilter),
        ("next_attempt_at", DateRangeFilter),
    )
    search_fields = ("=provider_message_id",)
    search_help_text = "NotificationId, tenant id (UUIDs, exact) or provider message id."
    list_select_related = ("channel",)
    list_per_page = 50
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("requeue_selected", "discard_selected")
    change_list_template = "notifications_retry/admin/notification_change_list.html"
    change_form_template = "notifications_retry/admin/notification_change_form.html"
    show_facets = NEVER_FACETS

    summary_fields = (
        "id",
        "status_badge",
        "channel",
        "tenant_id",
        "notification_type",
        "priority",
        "correlation_id",
        "created_at_display",
        "updated_at_display",
    )
    delivery_fields = (
        "attempts",
        "requeue_count",
        "next_attempt_at_display",
        "scheduled_at_display",
        "expires_at_display",
        "due_at_display",
        "claim_display",
        "provider_message_id",
        "esp_delivery_status",
    )
    failure_fields = (
        "error_kind",
        "last_error_display",
        "dead_lettered_at_display",
        "dead_letter_reason_display",
        "resolution",
        "resolved_at_display",
    )
    readonly_fields = (
        *summary_fields,
        "recipient",
        "masked_recipient",
        *delivery_fields,
        *failure_fields,
        "payload_display",
        "attempt_history",
        "triage_log",
        "outbox_events",
    )

    class Media:
        css = {"all": ("notifications_retry/admin.css",)}

    # Every time on the detail page in one format, with its time zone (Django's readonly datetimes
    # would use DATETIME_FORMAT, the attempt history ISO strings, the logs a third format).
    created_at_display = display.timestamp_display("created_at", "created at")
    updated_at_display = display.timestamp_display("updated_at", "updated at")
    next_attempt_at_display = display.timestamp_display("next_attempt_at", "next attempt at")
    scheduled_at_display = display.timestamp_display("scheduled_at", "scheduled at")
    expires_at_display = display.timestamp_display("expires_at", "expires at")
    due_at_display = display.timestamp_display("due_at", "due at")
    dead_lettered_at_display = display.timestamp_display("dead_lettered_at", "dead-lettered at")
    resolved_at_display = display.timestamp_display("resolved_at", "resolved at")

    # -- permissions: nothing is editable; triage has its own permissions ---------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def can_see_recipient(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(VIEW_RECIPIENT_PERM))

    # -- list columns -----------------------------------------------------------------------------------

    @admin.display(description="NotificationId", ordering="id")
    def short_id(self, obj: NotificationEntity) -> str:
        return str(obj.pk)[:8] + "…"

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: NotificationEntity) -> SafeString:
        return display.status_badge(obj)

    @admin.display(description="recipient")
    def masked_recipient(self, obj: NotificationEntity) -> str:
        return mask_recipient(obj.recipient)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: NotificationEntity) -> SafeString:
        return display.fragment(
            "attempts", attempts=obj.attempts, budget=obj.channel.max_attempts, requeues=obj.requeue_count
        )

    @admin.display(description="next", ordering="due_at")
    def due_display(self, obj: NotificationEntity) -> str:
        due_at, now = obj.due_at, timezone.now()
        if due_at is None and obj.claim_expires_at is not None:
            if obj.claim_expires_at > now:
                return "in flight"
            due_at = obj.claim_expires_at  # its worker died: due since its lease lapsed
        if due_at is None:
            return "—"
        delta = (due_at - now).total_seconds()
        return f"in {display.format_age(delta)}" if delta > 0 else f"due {display.format_age(-delta)} ago"

    @admin.display(description="error kind", ordering="error_kind")
    def error_kind_display(self, obj: NotificationEntity) -> SafeString:
        # Kinds are short words, but nothing stops a provider from a long one: it is cut to the column.
        return display.fragment("clipped", text=obj.error_kind or "—")

    @admin.display(description="age", ordering="-created_at")
    def age(self, obj: NotificationEntity) -> str:
        return display.format_age((timezone.now() - obj.created_at).total_seconds())

    # -- detail fields ----------------------------------------------------------------------------------

    @admin.display(description="claim")
    def claim_display(self, obj: NotificationEntity) -> str:
        if obj.claim_token is None:
            return "not claimed"
        if obj.claim_expires_at is None:
            return f"lease {obj.claim_token} lapsed (its worker stopped): due again"
        return f"claimed by {obj.claim_token}, lease until {display.timestamp(obj.claim_expires_at)}"

    @admin.display(description="last error")
    def last_error_display(self, obj: NotificationEntity) -> SafeString | str:
        return display.fragment("pre", css="nr-error", text=obj.last_error) if obj.last_error else "—"

    @admin.display(description="dead-letter reason")
    def dead_letter_reason_display(self, obj: NotificationEntity) -> SafeString | str:
        reason = obj.dead_letter_reason
        return display.fragment("pre", css="nr-error", text=reason) if reason else "—"

    @admin.display(description="payload")
    def payload_display(self, obj: NotificationEntity) -> SafeString:
        # Read as text, at most PAYLOAD_SHOWN_CHARS of it: a payload written past the API may be too
        # large to show or nested too deep for Python's decoder, and the page must still open.
        text = Cast("payload", TextField())
        shown, size = (
            NotificationEntity.objects.filter(pk=obj.pk)
            .values_list(Left(text, display.PAYLOAD_SHOWN_CHARS), Length(text))
            .get()
        )
        return display.payload_text(shown, size)

    def get_queryset(self, request: HttpRequest) -> QuerySet[NotificationEntity]:
        # The payload is read apart (payload_display): the list never shows it, and one Python cannot
        # decode must not break the list or the detail page.
        return super().get_queryset(request).defer("payload")

    @admin.display(description="attempt timeline")
    def attempt_history(self, obj: NotificationEntity) -> SafeString | str:
        return timeline(obj.attempt_log, attempts=obj.attempts, requeue_count=obj.requeue_count)

    @admin.display(description="triage log")
    def triage_log(self, obj: NotificationEntity) -> SafeString | str:
        actions = list(obj.triage_log.all()[:100])
        if not actions:
            return "Never triaged."
        return display.fragment("triage_log", actions=actions)

    @admin.display(description="delivery status (ESP)")
    def esp_delivery_status(self, obj: NotificationEntity) -> str:
        status = DeliveryStatus.objects.filter(notification=obj).first()
        if status is None:
            return "No report from the ESP."
        reached = [
            f"{state} {display.timestamp(at)}"
            for state in ("delivered", "opened", "bounced", "complained")
            if (at := getattr(status, f"{state}_at")) is not None
        ]
        return f"{status.get_state_display()} (by {status.esp}): " + "; ".join(reached)

    @admin.display(description="outbox events")
    def outbox_events(self, obj: NotificationEntity) -> SafeString | str:
        events = list(Outbox.objects.filter(key=str(obj.pk)).order_by("created_at", "id")[:50])
        if not events:
            return "No events (only Sent and terminal Failed emit one)."
        rows = [
            {
                "url": reverse("admin:notifications_retry_outbox_change", args=[e.pk]),
                "event_id": e.event_id,
                # A delivery-status event has a state where a dispatched one has a status.
                "status": (e.payload.get("status") or e.payload.get("state", ""))
                if isinstance(e.payload, dict)
                else "",
                "generation": e.generation,
                "created_at": e.created_at,
                "published_at": e.published_at,
            }
            for e in events
        ]
        return display.fragment("outbox_events", events=rows)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        recipient = "recipient" if self.can_see_recipient(request) else "masked_recipient"
        return [
            (None, {"fields": (*self.summary_fields[:3], recipient, *self.summary_fields[3:])}),
            ("Delivery", {"fields": self.delivery_fields}),
            ("Failure", {"fields": self.failure_fields}),
            ("Payload", {"fields": ("payload_display",)}),
            ("Attempts", {"fields": ("attempt_history",)}),
            ("Triage log", {"fields": ("triage_log",)}),
            ("Outbox events", {"fields": ("outbox_events",)}),
        ]

    # -- search: exact UUIDs (indexed), provider message ids --------------------------------------------

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(provider_message_id=term)
        try:
            value = uuid.UUID(term)
        except ValueError:
            pass
        else:
            condition |= Q(pk=value) | Q(tenant_id=value)
        return queryset.filter(condition), False

    # -- URLs, views -----------------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        info = (self.opts.app_label, self.opts.model_name)
        custom = [
            path("dashboard/", wrap(self.dashboard), name=f"{info[0]}_{info[1]}_dashboard"),
            path(
                "<path:object_id>/triage/<str:operation>/",
                wrap(self.triage_one),
                name=f"{info[0]}_{info[1]}_triage",
            ),
        ]
        return custom + super().get_urls()

    def dashboard(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return dashboard_view(request, self)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            self.refuse_forbidden_actions(request)
        context = {
            "dashboard_url": reverse("admin:notifications_retry_notificationentity_dashboard"),
            "bulk_action_cap": BULK_ACTION_CAP,
            # Past the cap: the same filter as a background recovery job (admin/recovery.py).
            "recovery_url": start_url_for_list(request.GET.dict())
            if self.has_requeue_permission(request)
            else "",
            **(extra_context or {}),
        }
        return super().changelist_view(request, context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        obj = self.get_object(request, object_id)
        if obj is not None:
            context["triage_links"] = self.triage_links(request, obj)
            # The page's heading and <title> say what its badge says (Django's would be str(obj): "failed").
            label, _ = display.state_label(obj)
            context["subtitle"] = f"{label.capitalize()}: {obj.pk} on {obj.channel.key}"
        return super().change_view(request, object_id, form_url, context)
