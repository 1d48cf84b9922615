"""The triage console: notifications, dead letters, channels, the outbox, and the queue health page.

Nothing here writes notification rows: requeue and discard go through
:mod:`notifications_retry.delivery.triage`,
which locks, checks the state, audits and updates in one transaction. The admin adds what only it
knows: who asked, the reason typed on the confirmation page (stored in the triage log and in an admin
``LogEntry``), permission checks that answer 403, and messages with the counts.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Field, Model, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from notifications_retry.delivery import triage
from notifications_retry.observability.masking import mask_recipient

from .admin_views import dashboard_view, format_age
from .conf import get_settings
from .models import (
    ChannelConfig,
    DeadLetterAction,
    NotificationEntity,
    NotificationQuerySet,
    Outbox,
    WorkerHeartbeat,
)
from .url_policy import webhook_url_problems

if TYPE_CHECKING:
    NotificationAdminBase = admin.ModelAdmin[NotificationEntity]
    ChannelAdminBase = admin.ModelAdmin[ChannelConfig]
    OutboxAdminBase = admin.ModelAdmin[Outbox]
    AuditAdminBase = admin.ModelAdmin[DeadLetterAction]
    HeartbeatAdminBase = admin.ModelAdmin[WorkerHeartbeat]
else:
    NotificationAdminBase = ChannelAdminBase = OutboxAdminBase = AuditAdminBase = HeartbeatAdminBase = (
        admin.ModelAdmin
    )

APP = NotificationEntity._meta.app_label
REQUEUE_PERM = f"{APP}.requeue_notificationentity"
DISCARD_PERM = f"{APP}.discard_notificationentity"
VIEW_RECIPIENT_PERM = f"{APP}.view_recipient"
# Facet counts scan the whole table per filter: never on a queue table (ShowFacets is Django 5.0+).
NEVER_FACETS: Any = getattr(getattr(admin, "ShowFacets", None), "NEVER", None)


def _pretty_json(value: Any) -> SafeString:
    """Indented JSON in a <pre>, escaped (payloads are untrusted)."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return format_html('<pre class="nr-json">{}</pre>', text)


def _single(value: Any) -> str:
    """A filter parameter's value: Django 5 passes lists, 4.2 strings."""
    if isinstance(value, list | tuple):
        return str(value[-1]) if value else ""
    return "" if value is None else str(value)


# ---------------------------------------------------------------------------------------------------------
# List filters


def _notifications(queryset: QuerySet[Any]) -> NotificationQuerySet:
    """The admin's queryset of notifications, typed as the app's QuerySet (its named states)."""
    return cast(NotificationQuerySet, queryset)


class DeadLetterFilter(admin.SimpleListFilter):
    title = "dead letter"
    parameter_name = "dead_letter"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("unresolved", "Yes, unresolved"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "yes":
            return _notifications(queryset).dead_letters()
        if value == "unresolved":
            return _notifications(queryset).unresolved_dead_letters()
        if value == "no":
            return queryset.filter(dead_lettered_at__isnull=True)
        return queryset


class ResolutionFilter(admin.SimpleListFilter):
    title = "resolution"
    parameter_name = "resolution"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("unresolved", "Unresolved dead letter"),
            (NotificationEntity.Resolution.DISCARDED, "Discarded"),
            (NotificationEntity.Resolution.UNRESOLVABLE, "Unresolvable (expired)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "unresolved":
            return _notifications(queryset).unresolved_dead_letters()
        if value in NotificationEntity.Resolution.values and value:
            return queryset.filter(resolution=value)
        return queryset


class QueueStateFilter(admin.SimpleListFilter):
    title = "queue state"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("due", "Due now"),
            ("in_flight", "In flight (claimed)"),
            ("waiting", "Waiting (not due yet)"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value, now = self.value(), timezone.now()
        if value == "due":
            return queryset.filter(due_at__lte=now, claim_token__isnull=True)
        if value == "in_flight":
            return queryset.filter(claim_token__isnull=False)
        if value == "waiting":
            return queryset.filter(due_at__gt=now, claim_token__isnull=True)
        return queryset


class ErrorKindFilter(admin.SimpleListFilter):
    title = "error kind"
    parameter_name = "error_kind"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Failed rows carry the kinds worth filtering; the (status, created_at) index keeps this cheap.
        kinds = (
            NotificationEntity.objects.filter(status=NotificationEntity.Status.FAILED)
            .exclude(error_kind="")
            .values_list("error_kind", flat=True)
            .distinct()
            .order_by("error_kind")[:50]
        )
        choices = [(kind, kind) for kind in kinds]
        current = self.value()
        if current and current not in {k for k, _ in choices}:
            choices.append((current, current))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(error_kind=value) if value else queryset


class TenantFilter(admin.SimpleListFilter):
    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # The tenants with the most dead letters (a partial index); any tenant is reachable by search.
        top = (
            NotificationEntity.objects.dead_letters()
            .exclude(tenant_id__isnull=True)
            .values("tenant_id")
            .annotate(n=Count("pk"))
            .order_by("-n", "tenant_id")[:10]
        )
        choices = [("none", "Platform (no tenant)")]
        choices += [(str(row["tenant_id"]), f"{str(row['tenant_id'])[:8]}… ({row['n']} dead)") for row in top]
        current = self.value()
        if current and current not in {k for k, _ in choices}:
            choices.append((current, current))
        return choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == "none":
            return queryset.filter(tenant_id__isnull=True)
        try:
            return queryset.filter(tenant_id=uuid.UUID(value))
        except ValueError:
            return queryset.none()


class DateRangeFilter(admin.FieldListFilter):
    """Presets (last 24 h / 7 / 30 days) and a from/to form; ``to`` is inclusive for a plain date."""

    template = "notifications_retry/admin/date_range_filter.html"
    presets = (
        ("Last 24 hours", timedelta(hours=24)),
        ("Last 7 days", timedelta(days=7)),
        ("Last 30 days", timedelta(days=30)),
    )

    def __init__(
        self,
        field: Field[Any, Any],
        request: HttpRequest,
        params: dict[str, Any],
        model: type[Model],
        model_admin: Any,
        field_path: str,
    ) -> None:
        self.param_from = f"{field_path}__from"
        self.param_to = f"{field_path}__to"
        super().__init__(field, request, params, model, model_admin, field_path)
        self.value_from = _single(self.used_parameters.get(self.param_from))
        self.value_to = _single(self.used_parameters.get(self.param_to))

    def expected_parameters(self) -> list[str | None]:
        return [self.param_from, self.param_to]

    def has_output(self) -> bool:
        return True

    @staticmethod
    def _bound(text: str, *, end: bool) -> datetime:
        moment = parse_datetime(text)
        if moment is None:
            day = parse_date(text)
            if day is None:
                raise ValidationError(f"not a date: {text!r}")
            moment = datetime.combine(day + timedelta(days=1) if end else day, time.min)
        if timezone.is_naive(moment):
            moment = timezone.make_aware(moment)
        return moment

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        from django.contrib.admin.options import IncorrectLookupParameters

        try:
            if self.value_from:
                queryset = queryset.filter(
                    **{f"{self.field_path}__gte": self._bound(self.value_from, end=False)}
                )
            if self.value_to:
                end = self._bound(self.value_to, end=True)
                lookup = "lt" if parse_datetime(self.value_to) is None else "lte"
                queryset = queryset.filter(**{f"{self.field_path}__{lookup}": end})
        except (ValidationError, ValueError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        return queryset

    def choices(self, changelist: Any) -> Iterator[Any]:  # adds a "form" item to Django's choice dicts
        mine = {self.param_from, self.param_to}
        yield {
            "selected": not (self.value_from or self.value_to),
            "query_string": changelist.get_query_string(remove=list(mine)),
            "display": "Any time",
        }
        now = timezone.now()
        for label, span in self.presets:
            start = (now - span).replace(second=0, microsecond=0).isoformat()
            yield {
                "selected": False,
                "query_string": changelist.get_query_string({self.param_from: start}, remove=[self.param_to]),
                "display": label,
            }
        hidden = [(k, _single(v)) for k, v in changelist.params.items() if k not in mine and k != "p"]
        yield {
            "form": True,
            "hidden": hidden,
            "param_from": self.param_from,
            "param_to": self.param_to,
            "value_from": self.value_from[:10] if parse_datetime(self.value_from) is None else "",
            "value_to": self.value_to[:10] if parse_datetime(self.value_to) is None else "",
            "current": (self.value_from, self.value_to) if (self.value_from or self.value_to) else None,
        }


# ---------------------------------------------------------------------------------------------------------
# Triage: the confirmation form and the call into the service


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Why: stored in the triage log and the admin history.",
    )


class TriageOperation:
    """One triage action: the service function, its permission, and which rows it applies to."""

    def __init__(
        self,
        name: str,
        verb: str,
        past: str,
        perm: str,
        service: Callable[..., triage.TriageResult],
        eligible: Q,
        explanation: str,
    ) -> None:
        self.name, self.verb, self.past, self.perm = name, verb, past, perm
        self.service, self.eligible, self.explanation = service, eligible, explanation


OPERATIONS: dict[str, TriageOperation] = {
    "requeue": TriageOperation(
        "requeue",
        "Requeue",
        "Requeued",
        REQUEUE_PERM,
        triage.requeue,
        Q(dead_lettered_at__isnull=False),
        "Each dead letter gets a fresh attempt budget and is due now; the worker sends it on its next tick.",
    ),
    "discard": TriageOperation(
        "discard",
        "Discard",
        "Discarded",
        DISCARD_PERM,
        triage.discard,
        Q(dead_lettered_at__isnull=False) & ~Q(resolution=NotificationEntity.Resolution.DISCARDED),
        "Each dead letter is marked discarded and will never be sent.",
    ),
}
ACTION_OPERATION = {"requeue_selected": "requeue", "discard_selected": "discard"}


def _summarize_refusals(refused: dict[uuid.UUID, str]) -> str:
    counts = Counter(refused.values())
    return "; ".join(f"{reason} ({n})" for reason, n in counts.most_common())


@admin.register(NotificationEntity)
class NotificationEntityAdmin(NotificationAdminBase):
    """Read-only notifications with triage actions; the recipient is masked unless permitted."""

    list_display = (
        "short_id",
        "status_badge",
        "channel",
        "tenant",
        "masked_recipient",
        "attempts_display",
        "due_display",
        "error_kind_display",
        "dead_lettered",
        "resolution_display",
        "age",
    )
    list_display_links = ("short_id",)
    list_filter = (
        "status",
        DeadLetterFilter,
        ResolutionFilter,
        QueueStateFilter,
        "channel",
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
        "created_at",
        "updated_at",
    )
    delivery_fields = (
        "attempts",
        "requeue_count",
        "next_attempt_at",
        "scheduled_at",
        "expires_at",
        "due_at",
        "claim_display",
        "provider_message_id",
    )
    failure_fields = (
        "error_kind",
        "last_error_display",
        "dead_lettered_at",
        "dead_letter_reason_display",
        "resolution",
        "resolved_at",
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

    # -- permissions: nothing is editable; triage has its own permissions ---------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(REQUEUE_PERM))

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(DISCARD_PERM))

    def can_see_recipient(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(VIEW_RECIPIENT_PERM))

    # -- list columns -----------------------------------------------------------------------------------

    @admin.display(description="NotificationId", ordering="id")
    def short_id(self, obj: NotificationEntity) -> str:
        return str(obj.pk)[:8] + "…"

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: NotificationEntity) -> SafeString:
        if obj.dead_lettered_at is not None:
            label = (
                "dead letter" if not obj.resolution else obj.get_resolution_display().split(" (")[0].lower()
            )
            css = "dead" if not obj.resolution else "resolved"
        else:
            label, css = obj.get_status_display().lower(), obj.status
        return format_html('<span class="nr-badge nr-{}">{}</span>', css, label)

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant(self, obj: NotificationEntity) -> str:
        return str(obj.tenant_id)[:8] + "…" if obj.tenant_id else "platform"

    @admin.display(description="recipient")
    def masked_recipient(self, obj: NotificationEntity) -> str:
        return mask_recipient(obj.recipient)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: NotificationEntity) -> str:
        text = f"{obj.attempts}/{obj.channel.max_attempts}"
        return f"{text} (requeued {obj.requeue_count}x)" if obj.requeue_count else text

    @admin.display(description="due / next attempt", ordering="due_at")
    def due_display(self, obj: NotificationEntity) -> str:
        if obj.due_at is None:
            return "—"
        delta = (obj.due_at - timezone.now()).total_seconds()
        return f"in {format_age(delta)}" if delta > 0 else f"due {format_age(-delta)} ago"

    @admin.display(description="error kind", ordering="error_kind")
    def error_kind_display(self, obj: NotificationEntity) -> str:
        return obj.error_kind or "—"

    @admin.display(description="dead lettered", ordering="dead_lettered_at")
    def dead_lettered(self, obj: NotificationEntity) -> SafeString | str:
        if obj.dead_lettered_at is None:
            return "—"
        ago = format_age((timezone.now() - obj.dead_lettered_at).total_seconds())
        return format_html('<span title="{}">{} ago</span>', obj.dead_lettered_at.isoformat(), ago)

    @admin.display(description="resolution", ordering="resolution")
    def resolution_display(self, obj: NotificationEntity) -> str:
        if obj.dead_lettered_at is None:
            return "—"
        return obj.get_resolution_display() if obj.resolution else "unresolved"

    @admin.display(description="age", ordering="-created_at")
    def age(self, obj: NotificationEntity) -> str:
        return format_age((timezone.now() - obj.created_at).total_seconds())

    # -- detail fields ----------------------------------------------------------------------------------

    @admin.display(description="claim")
    def claim_display(self, obj: NotificationEntity) -> str:
        if obj.claim_token is None:
            return "not claimed"
        return f"claimed by {obj.claim_token}, lease until {obj.claim_expires_at:%Y-%m-%d %H:%M:%S}"

    @admin.display(description="last error")
    def last_error_display(self, obj: NotificationEntity) -> SafeString | str:
        return format_html('<pre class="nr-error">{}</pre>', obj.last_error) if obj.last_error else "—"

    @admin.display(description="dead-letter reason")
    def dead_letter_reason_display(self, obj: NotificationEntity) -> SafeString | str:
        reason = obj.dead_letter_reason
        return format_html('<pre class="nr-error">{}</pre>', reason) if reason else "—"

    @admin.display(description="payload")
    def payload_display(self, obj: NotificationEntity) -> SafeString:
        return _pretty_json(obj.payload)

    @admin.display(description="attempt history")
    def attempt_history(self, obj: NotificationEntity) -> SafeString | str:
        entries = [e for e in (obj.attempt_log or []) if isinstance(e, dict)]
        if not entries:
            return "No attempts recorded."
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            (
                (
                    e.get("attempt", ""),
                    e.get("at", ""),
                    e.get("outcome", ""),
                    e.get("error_kind") or "",
                    e.get("error") or "",
                )
                for e in entries
            ),
        )
        return format_html(
            '<table class="nr-table"><thead><tr><th>#</th><th>at</th><th>outcome</th><th>error kind</th>'
            "<th>error</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    @admin.display(description="triage log")
    def triage_log(self, obj: NotificationEntity) -> SafeString | str:
        actions = list(obj.triage_log.all()[:100])
        if not actions:
            return "Never triaged."
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    f"{a.created_at:%Y-%m-%d %H:%M:%S}",
                    a.get_action_display(),
                    a.actor,
                    a.attempts_before,
                    a.reason,
                )
                for a in actions
            ),
        )
        return format_html(
            '<table class="nr-table"><thead><tr><th>at</th><th>action</th><th>by</th><th>attempts before</th>'
            "<th>reason</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    @admin.display(description="outbox events")
    def outbox_events(self, obj: NotificationEntity) -> SafeString | str:
        events = list(Outbox.objects.filter(key=str(obj.pk)).order_by("created_at", "id")[:50])
        if not events:
            return "No events (only Sent and terminal Failed emit one)."
        rows = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (
                (
                    reverse("admin:notifications_retry_outbox_change", args=[e.pk]),
                    e.event_id,
                    e.payload.get("status", "") if isinstance(e.payload, dict) else "",
                    e.generation,
                    f"{e.created_at:%Y-%m-%d %H:%M:%S}",
                    f"{e.published_at:%Y-%m-%d %H:%M:%S}" if e.published_at else "not yet",
                )
                for e in events
            ),
        )
        return format_html(
            '<table class="nr-table"><thead><tr><th>event id</th><th>status</th><th>generation</th>'
            "<th>created</th><th>published</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        recipient = "recipient" if self.can_see_recipient(request) else "masked_recipient"
        return [
            (None, {"fields": (*self.summary_fields[:3], recipient, *self.summary_fields[3:])}),
            ("Delivery", {"fields": self.delivery_fields}),
            ("Failure", {"fields": self.failure_fields}),
            ("Payload", {"fields": ("payload_display",)}),
            ("Attempt history", {"fields": ("attempt_history",)}),
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
            # Django answers an action the user may not run with "No action selected"; say 403 instead.
            for name in request.POST.getlist("action"):
                op = OPERATIONS.get(ACTION_OPERATION.get(name, ""))
                if op is not None and not request.user.has_perm(op.perm):
                    raise PermissionDenied
        context = {
            "dashboard_url": reverse("admin:notifications_retry_notificationentity_dashboard"),
            "bulk_action_cap": get_settings().BULK_ACTION_CAP,
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
            context["triage_links"] = [
                (
                    op.verb,
                    reverse("admin:notifications_retry_notificationentity_triage", args=[obj.pk, op.name]),
                )
                for op in OPERATIONS.values()
                if request.user.has_perm(op.perm)
                and NotificationEntity.objects.filter(op.eligible, pk=obj.pk).exists()
            ]
        return super().change_view(request, object_id, form_url, context)

    def triage_one(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """Requeue or discard one notification from its detail page, after a confirmation page."""
        op = OPERATIONS.get(operation)
        if op is None:
            raise PermissionDenied
        if not request.user.has_perm(op.perm):
            raise PermissionDenied
        obj = get_object_or_404(NotificationEntity, pk=self._uuid_or_404(object_id))
        change_url = reverse("admin:notifications_retry_notificationentity_change", args=[obj.pk])
        form = ReasonForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            self._run(request, op, [obj.pk], form.cleaned_data["reason"])
            return HttpResponseRedirect(change_url)
        return self._confirmation(
            request, op, NotificationEntity.objects.filter(pk=obj.pk), form, hidden=[], cancel_url=change_url
        )

    @staticmethod
    def _uuid_or_404(value: str) -> uuid.UUID:
        try:
            return uuid.UUID(value)
        except ValueError as exc:
            raise Http404("no such notification") from exc

    # -- actions ----------------------------------------------------------------------------------------

    @admin.action(description="Requeue selected dead letters (retry now)…", permissions=["requeue"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._bulk(request, OPERATIONS["requeue"], queryset)

    @admin.action(description="Discard selected dead letters…", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._bulk(request, OPERATIONS["discard"], queryset)

    def _bulk(
        self, request: HttpRequest, op: TriageOperation, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        if not request.user.has_perm(op.perm):
            raise PermissionDenied
        cap = get_settings().BULK_ACTION_CAP
        across = request.POST.get("select_across") == "1"
        total = queryset.count()
        if total > cap:
            self.message_user(
                request,
                f"{total} notifications match; the cap for one action is {cap} (BULK_ACTION_CAP). "
                "Narrow the filter and try again.",
                messages.ERROR,
            )
            return None
        form = ReasonForm(request.POST if request.POST.get("confirm") == "yes" else None)
        if form.is_bound and form.is_valid():
            ids = list(queryset.values_list("pk", flat=True))
            self._run(request, op, ids, form.cleaned_data["reason"])
            return None
        hidden = [
            ("action", f"{op.name}_selected"),
            ("select_across", "1" if across else "0"),
            ("index", "0"),
        ]
        hidden += [("_selected_action", pk) for pk in request.POST.getlist("_selected_action")]
        return self._confirmation(
            request, op, queryset, form, hidden=hidden, cancel_url=request.get_full_path(), across=across
        )

    def _confirmation(
        self,
        request: HttpRequest,
        op: TriageOperation,
        queryset: QuerySet[Any],
        form: ReasonForm,
        *,
        hidden: Sequence[tuple[str, Any]],
        cancel_url: str,
        across: bool = False,
    ) -> TemplateResponse:
        total = queryset.count()
        eligible = queryset.filter(op.eligible).count()
        sample = list(queryset.select_related("channel").order_by("-created_at")[:20])
        context = {
            **self.admin_site.each_context(request),
            "title": f"{op.verb} notifications",
            "opts": self.opts,
            "operation": op,
            "form": form,
            "hidden": hidden,
            "total": total,
            "eligible": eligible,
            "refused": total - eligible,
            "across": across,
            "sample": [(obj, mask_recipient(obj.recipient), self.status_badge(obj)) for obj in sample],
            "more": max(0, total - len(sample)),
            "cancel_url": cancel_url,
            "cap": get_settings().BULK_ACTION_CAP,
        }
        return TemplateResponse(request, "notifications_retry/admin/triage_confirmation.html", context)

    def _run(self, request: HttpRequest, op: TriageOperation, ids: Iterable[uuid.UUID], reason: str) -> None:
        """Call the service, write one LogEntry per changed row, report counts."""
        result = op.service(list(ids), actor=request.user.get_username(), reason=reason)
        for obj in NotificationEntity.objects.filter(pk__in=result.done).select_related("channel"):
            self.log_change(request, obj, f"{op.past} (triage). Reason: {reason}")
        if result.done:
            self.message_user(request, f"{op.past} {len(result.done)} notification(s).", messages.SUCCESS)
        if result.refused:
            self.message_user(
                request,
                f"Refused {len(result.refused)} notification(s): {_summarize_refusals(result.refused)}.",
                messages.WARNING,
            )


# ---------------------------------------------------------------------------------------------------------
# Channels


class ChannelConfigForm(forms.ModelForm):  # type: ignore[type-arg]
    """Options without the secret (write-only field beside it), webhook URLs checked by the URL policy."""

    secret = forms.CharField(
        required=False,
        strip=False,
        label="Provider secret",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
    )
    clear_secret = forms.BooleanField(required=False, label="Remove the stored secret")

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
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = dict(self.instance.options or {}) if isinstance(self.instance.options, dict) else {}
        self.stored_secret: str | None = options.pop("secret", None)
        self.initial["options"] = options
        self.fields["secret"].help_text = (
            "A secret is stored (never shown). Type a new one to replace it, or leave empty to keep it."
            if self.stored_secret
            else "No secret stored. Type one to set it; it is never shown again."
        )
        self.fields["options"].help_text = (
            'Provider options as JSON, e.g. {"url": "https://hooks.example.com/notify"}. '
            "The secret goes in its own field below."
        )

    def clean_options(self) -> dict[str, Any]:
        value = self.cleaned_data.get("options")
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise ValidationError("Options must be a JSON object.")
        if "secret" in value:
            raise ValidationError(
                "Put the secret in the Provider secret field: options never hold it in clear."
            )
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "options" not in data:
            return data
        options = dict(data["options"])
        if data.get("secret"):
            options["secret"] = data["secret"]
        elif self.stored_secret is not None and not data.get("clear_secret"):
            options["secret"] = self.stored_secret
        data["options"] = options
        url = options.get("url")
        if url is not None or data.get("provider_key") == "webhook":
            for problem in webhook_url_problems(url if isinstance(url, str) else ""):
                self.add_error("options", problem)
        return data


@admin.register(ChannelConfig)
class ChannelConfigAdmin(ChannelAdminBase):
    form = ChannelConfigForm
    list_display = (
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
        "secret_display",
        "health",
    )
    list_display_links = ("key",)
    list_editable = ("is_enabled",)
    list_filter = ("is_enabled", "provider_key", "retry_backoff")
    search_fields = ("key", "provider_key")
    readonly_fields = ("problems_display", "created_at", "updated_at")
    actions = ("enable_channels", "disable_channels")
    fieldsets = (
        (None, {"fields": ("key", "is_enabled", "provider_key", "problems_display")}),
        (
            "Retries",
            {"fields": ("max_attempts", "retry_backoff", "backoff_base_seconds", "backoff_cap_seconds")},
        ),
        ("Limits", {"fields": ("timeout_seconds", "rate_limit_per_second", "max_concurrency")}),
        ("Provider", {"fields": ("options", "secret", "clear_secret")}),
        ("Dates", {"fields": ("created_at", "updated_at")}),
    )

    class Media:
        css = {"all": ("notifications_retry/admin.css",)}

    @admin.display(description="secret")
    def secret_display(self, obj: ChannelConfig) -> str:
        return "•••••• (set)" if isinstance(obj.options, dict) and obj.options.get("secret") else "—"

    @admin.display(description="configuration")
    def health(self, obj: ChannelConfig) -> SafeString:
        problems = obj.configuration_problems()
        if problems:
            return format_html('<span class="nr-badge nr-dead" title="{}">broken</span>', "; ".join(problems))
        return mark_safe('<span class="nr-badge nr-sent">ok</span>')  # a constant: nothing to escape

    @admin.display(description="configuration problems")
    def problems_display(self, obj: ChannelConfig) -> str:
        if obj.pk is None:
            return "—"
        problems = obj.configuration_problems()
        return "; ".join(problems) if problems else "none: the channel can send"

    @admin.action(description="Enable selected channels", permissions=["change"])
    def enable_channels(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set_enabled(request, queryset, True)

    @admin.action(description="Disable selected channels (rows wait untouched)", permissions=["change"])
    def disable_channels(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        self._set_enabled(request, queryset, False)

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[Any], enabled: bool) -> None:
        changed = list(queryset.exclude(is_enabled=enabled))
        ChannelConfig.objects.filter(pk__in=[c.pk for c in changed]).update(
            is_enabled=enabled, updated_at=timezone.now()
        )
        for channel in changed:
            self.log_change(request, channel, "Enabled." if enabled else "Disabled.")
        verb = "Enabled" if enabled else "Disabled"
        self.message_user(request, f"{verb} {len(changed)} channel(s).", messages.SUCCESS)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and not self.has_change_permission(request):
            raise PermissionDenied
        return super().changelist_view(request, extra_context)


# ---------------------------------------------------------------------------------------------------------
# Outbox and audit: read only


class PublishedFilter(admin.SimpleListFilter):
    title = "published"
    parameter_name = "published"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Published"), ("no", "Not published yet")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(published_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(published_at__isnull=True)
        return queryset


class ReadOnlyMixin:
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Outbox)
class OutboxAdmin(ReadOnlyMixin, OutboxAdminBase):
    list_display = (
        "id",
        "topic",
        "notification_link",
        "event_status",
        "generation",
        "created_at",
        "published_at",
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
        "created_at",
        "published_at",
    )
    readonly_fields = fields
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
        return format_html('<a href="{}">{}</a>', url, obj.key)

    @admin.display(description="status")
    def event_status(self, obj: Outbox) -> str:
        return str(obj.payload.get("status", "")) if isinstance(obj.payload, dict) else ""

    @admin.display(description="payload")
    def payload_display(self, obj: Outbox) -> SafeString:
        return _pretty_json(obj.payload)

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

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


@admin.register(DeadLetterAction)
class DeadLetterActionAdmin(ReadOnlyMixin, AuditAdminBase):
    list_display = ("created_at", "action", "actor", "notification_id", "attempts_before", "reason")
    list_filter = ("action", ("created_at", DateRangeFilter))
    search_fields = ("actor",)
    ordering = ("-created_at",)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyMixin, HeartbeatAdminBase):
    list_display = (
        "lane",
        "hostname",
        "pid",
        "last_tick_started_at",
        "last_tick_completed_at",
    )

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}
