"""Recovery jobs in the admin: start one from the notification list's filter, watch its progress, cancel it.

The synchronous bulk actions keep their cap (``triage_actions.BULK_ACTION_CAP``); a recovery job has none:
it runs in the background (``manage.py notifications_recover --work``), chunk by chunk. Starting and
cancelling need the requeue permission and go through :mod:`notifications_retry.delivery.recovery`, like
the command.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.dateparse import parse_date
from django.utils.safestring import SafeString

from notifications_retry.delivery import recovery
from notifications_retry.delivery.recovery_filter import RecoveryInputError, parse_moment, recovery_filter
from notifications_retry.models import ChannelConfig, RecoveryJob

from . import display
from .triage_actions import BULK_ACTION_CAP, REQUEUE_PERM

CANCEL_PERM = f"{RecoveryJob._meta.app_label}.cancel_recoveryjob"

if TYPE_CHECKING:
    RecoveryJobAdminBase = admin.ModelAdmin[RecoveryJob]
else:
    RecoveryJobAdminBase = admin.ModelAdmin

#: The notification list's filters a recovery job takes over; any other narrows the list but not the job.
CARRIED_OVER = {
    "channel__id__exact",
    "dead_lettered_at__from",
    "dead_lettered_at__to",
    "dead_letter",
    "resolution",
}
#: Parameters of the list that are not filters (page, ordering, search is a filter: it is named).
NOT_FILTERS = {"p", "o", "_changelist_filters", "e", "all"}
STATUS_FROM_LIST = {
    ("dead_letter", "unresolved"): RecoveryJob.RowStatus.DEAD_LETTER,
    ("resolution", "unresolved"): RecoveryJob.RowStatus.DEAD_LETTER,
    ("resolution", "discarded"): RecoveryJob.RowStatus.DISCARDED,
    ("resolution", "unresolvable"): RecoveryJob.RowStatus.UNRESOLVABLE,
}


def _list_bound(text: str, *, end: bool) -> datetime:
    """A date filter's bound: a plain date's "to" is inclusive (the next midnight), as the list shows it."""
    day = parse_date(text.strip())
    if day is None:
        return parse_moment(text, option="dead-lettered")
    return timezone.make_aware(datetime.combine(day + timedelta(days=1) if end else day, time.min))


def start_url_for_list(params: dict[str, str]) -> str:
    """The start page's URL, its form filled from the notification list's current filter ``params``."""
    initial: dict[str, str] = {}
    if params.get("channel__id__exact"):
        initial["channel"] = params["channel__id__exact"]
    try:
        if params.get("dead_lettered_at__from"):
            initial["since"] = _list_bound(params["dead_lettered_at__from"], end=False).isoformat()
        if params.get("dead_lettered_at__to"):
            initial["until"] = _list_bound(params["dead_lettered_at__to"], end=True).isoformat()
    except RecoveryInputError:
        pass  # the list itself says the date is wrong; the form starts without it
    for (name, value), status in STATUS_FROM_LIST.items():
        if params.get(name) == value:
            initial["status"] = status
    ignored = sorted(k for k, v in params.items() if v and k not in CARRIED_OVER and k not in NOT_FILTERS)
    if ignored:
        initial["ignored"] = ",".join(ignored)
    url = reverse("admin:notifications_retry_recoveryjob_start")
    return f"{url}?{urlencode(initial)}" if initial else url


class StartRecoveryForm(forms.Form):
    """The job's filter, as the command takes it, and the reason stored in every requeue's audit row."""

    channel = forms.ModelChoiceField(queryset=ChannelConfig.objects.order_by("key"), to_field_name="pk")
    since = forms.CharField(help_text="Dead-lettered at or after (ISO 8601, e.g. 2026-03-01T02:00:00+00:00).")
    until = forms.CharField(help_text="Dead-lettered before (ISO 8601).")
    status = forms.ChoiceField(
        choices=RecoveryJob.RowStatus.choices, initial=RecoveryJob.RowStatus.DEAD_LETTER
    )
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Why: stored in each requeue's triage log entry.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        try:
            data["selection"] = recovery_filter(
                channel=data["channel"].key,
                since=parse_moment(data["since"], option="since"),
                until=parse_moment(data["until"], option="until"),
                status=data["status"],
            )
        except RecoveryInputError as exc:
            raise forms.ValidationError(str(exc).replace("--", "")) from None
        return data


@admin.register(RecoveryJob)
class RecoveryJobAdmin(RecoveryJobAdminBase):
    """Jobs listed with their progress; the detail page refreshes itself while the job runs."""

    # Narrow enough for a 1,440 px screen with both sidebars open (a browser test measures it).
    list_display = (
        "id",
        "channel",
        "window",
        "state_badge",
        "progress_short",
        "started_by",
        "created_at_display",
    )
    list_filter = ("state", "channel")
    list_select_related = ("channel",)
    ordering = ("-created_at", "-id")
    change_form_template = "notifications_retry/admin/recovery_job_change_form.html"
    change_list_template = "notifications_retry/admin/recovery_job_change_list.html"
    fields = (
        "state_badge",
        "progress",
        "channel",
        "window",
        "row_status",
        "total",
        "done",
        "failed",
        "refusals_display",
        "started_by",
        "reason",
        "created_at_display",
        "started_at_display",
        "heartbeat_at_display",
        "finished_at_display",
        "cancelled_by",
        "last_error",
    )
    readonly_fields = fields
    created_at_display = display.timestamp_display("created_at")
    started_at_display = display.timestamp_display("started_at")
    heartbeat_at_display = display.timestamp_display("heartbeat_at", "last chunk at")
    finished_at_display = display.timestamp_display("finished_at")

    class Media:
        css = {"all": ("notifications_retry/admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # the start page (below) creates jobs through the service

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest, action_location: Any = None) -> dict[str, Any]:
        return {}

    def may_run(self, request: HttpRequest) -> bool:
        """Starting a job is a requeue of every row it matches: the requeue permission."""
        return bool(request.user.has_perm(REQUEUE_PERM))

    def may_cancel(self, request: HttpRequest) -> bool:
        """Whoever may start a job may stop one; "Can cancel recovery jobs" alone allows only that."""
        return self.may_run(request) or bool(request.user.has_perm(CANCEL_PERM))

    @admin.display(description="dead-lettered")
    def window(self, obj: RecoveryJob) -> str:
        rows = obj.get_row_status_display().lower()
        return f"{display.timestamp(obj.since)} to {display.timestamp(obj.until)} ({rows})"

    @admin.display(description="state", ordering="state")
    def state_badge(self, obj: RecoveryJob) -> SafeString:
        return display.fragment("recovery_state", job=obj)

    @admin.display(description="progress")
    def progress(self, obj: RecoveryJob) -> SafeString:
        return display.fragment("recovery_progress", job=obj)

    @admin.display(description="progress")
    def progress_short(self, obj: RecoveryJob) -> SafeString:
        return display.fragment("recovery_progress", job=obj, short=True)

    @admin.display(description="refused, by reason")
    def refusals_display(self, obj: RecoveryJob) -> str:
        return "; ".join(f"{reason}: {n}" for reason, n in obj.refusals.items()) or "—"

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        return [
            path("start/", wrap(self.start_view), name="notifications_retry_recoveryjob_start"),
            path(
                "<int:job_id>/cancel/", wrap(self.cancel_view), name="notifications_retry_recoveryjob_cancel"
            ),
            *super().get_urls(),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"may_run": self.may_run(request), **(extra_context or {})}
        return super().changelist_view(request, context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        job = self.get_object(request, object_id)
        context = {
            "may_cancel": job is not None
            and self.may_cancel(request)
            and job.state not in (RecoveryJob.State.DONE, RecoveryJob.State.CANCELLED),
            "refresh": job is not None and job.is_active,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def start_view(self, request: HttpRequest) -> HttpResponse:
        """The form, filled from the notification list's filter; on confirmation a pending job."""
        if not self.may_run(request):
            raise PermissionDenied
        form = StartRecoveryForm(
            request.POST if request.method == "POST" else None, initial=request.GET.dict()
        )
        conflict: RecoveryJob | None = None
        if request.method == "POST" and form.is_valid():
            try:
                job = recovery.start_job(
                    form.cleaned_data["selection"],
                    actor=request.user.get_username(),
                    reason=form.cleaned_data["reason"],
                )
            except recovery.RecoveryConflict as exc:
                conflict = exc.existing
                form.add_error(None, str(exc).split(": resume")[0] + ".")
            else:
                self.log_addition(request, job, f"Started. Reason: {job.reason}")
                self.message_user(request, f"Recovery job #{job.pk} started: {job.total} matching row(s).")
                return HttpResponseRedirect(
                    reverse("admin:notifications_retry_recoveryjob_change", args=[job.pk])
                )
        matching = None
        if not form.is_bound and {"channel", "since", "until"} <= set(request.GET):
            probe = StartRecoveryForm(
                {"status": RecoveryJob.RowStatus.DEAD_LETTER, **request.GET.dict(), "reason": "-"}
            )
            if probe.is_valid():
                selection = probe.cleaned_data["selection"]
                matching = (
                    RecoveryJob(
                        channel=selection.channel,
                        since=selection.since,
                        until=selection.until,
                        row_status=selection.row_status,
                    )
                    .matching()
                    .count()
                )
        context = {
            **self.admin_site.each_context(request),
            "title": "Requeue all matching dead letters in the background",
            "opts": self.opts,
            "form": form,
            "matching": matching,
            "conflict": conflict,
            "ignored": [p for p in request.GET.get("ignored", "").split(",") if p],
            "cap": BULK_ACTION_CAP,
        }
        return TemplateResponse(request, "notifications_retry/admin/recovery_start.html", context)

    def cancel_view(self, request: HttpRequest, job_id: int) -> HttpResponse:
        if not self.may_cancel(request):
            raise PermissionDenied
        job = get_object_or_404(RecoveryJob, pk=job_id)
        if request.method == "POST":
            try:
                recovery.cancel_job(job.pk, actor=request.user.get_username())
            except recovery.RecoveryStateError as exc:
                self.message_user(request, str(exc), messages.WARNING)
            else:
                self.log_change(request, job, "Cancelled.")
                self.message_user(
                    request, f"Recovery job #{job.pk} cancelled; what it requeued stays requeued."
                )
        return HttpResponseRedirect(reverse("admin:notifications_retry_recoveryjob_change", args=[job.pk]))
