"""Requeue and discard from the admin: permissions, the confirmation page with its reason, the service call.

Which rows an operation applies to is not decided here: the QuerySet methods
(:meth:`~notifications_retry.models.NotificationQuerySet.requeueable`, ``discardable``) decide, for the
confirmation counts and the detail page's links as for :mod:`notifications_retry.delivery.triage`, which
refuses the rest; a requeue also refuses a dead letter whose recipient is suppressed now
(``triage.suppressed_recipients``), and the admin counts it so. So the admin never offers what the
service would then refuse.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from notifications_retry.delivery import triage
from notifications_retry.models import NotificationEntity, NotificationQuerySet
from notifications_retry.observability.masking import mask_recipient

from .display import status_badge

#: The most rows one synchronous bulk action (requeue, discard) may touch: it runs inside the admin's
#: request, with an audit entry a row, so it must end well within a proxy's timeout. Past it, a
#: recovery job (admin/recovery.py) requeues any number in the background.
BULK_ACTION_CAP = 1000

if TYPE_CHECKING:
    NotificationAdminBase = admin.ModelAdmin[NotificationEntity]
else:
    NotificationAdminBase = admin.ModelAdmin

APP = NotificationEntity._meta.app_label
REQUEUE_PERM = f"{APP}.requeue_notificationentity"
DISCARD_PERM = f"{APP}.discard_notificationentity"


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Why: stored in the triage log and the admin history.",
    )


@dataclasses.dataclass(frozen=True)
class TriageOperation:
    """One triage action: the service function, its permission, and which rows it applies to."""

    name: str
    verb: str
    past: str
    perm: str
    service: Callable[..., triage.TriageResult]
    eligible: Callable[[NotificationQuerySet, datetime], NotificationQuerySet]
    explanation: str


OPERATIONS: dict[str, TriageOperation] = {
    "requeue": TriageOperation(
        "requeue",
        "Requeue",
        "Requeued",
        REQUEUE_PERM,
        triage.requeue,
        lambda rows, now: rows.requeueable(now),
        "Each dead letter gets a fresh attempt budget and is due now; the worker sends it on its next tick.",
    ),
    "discard": TriageOperation(
        "discard",
        "Discard",
        "Discarded",
        DISCARD_PERM,
        triage.discard,
        lambda rows, now: rows.discardable(),
        "Each dead letter is marked discarded and will never be sent.",
    ),
}
ACTION_OPERATION = {"requeue_selected": "requeue", "discard_selected": "discard"}


def _notifications(queryset: QuerySet[Any]) -> NotificationQuerySet:
    """The admin's queryset of notifications, typed as the app's QuerySet (its named states)."""
    return cast(NotificationQuerySet, queryset)


def _summarize_refusals(refused: dict[uuid.UUID, str]) -> str:
    counts = Counter(refused.values())
    return "; ".join(f"{reason} ({n})" for reason, n in counts.most_common())


def _uuid_or_404(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError as exc:
        raise Http404("no such notification") from exc


class TriageActions(NotificationAdminBase):
    """The triage half of the notification admin: the two actions and the detail page's triage view."""

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(REQUEUE_PERM))

    def has_discard_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(DISCARD_PERM))

    def refuse_forbidden_actions(self, request: HttpRequest) -> None:
        """Django answers an action the user may not run with "No action selected"; say 403 instead."""
        for name in request.POST.getlist("action"):
            op = OPERATIONS.get(ACTION_OPERATION.get(name, ""))
            if op is not None and not request.user.has_perm(op.perm):
                raise PermissionDenied

    def triage_links(self, request: HttpRequest, obj: NotificationEntity) -> list[tuple[str, str]]:
        """The operations the user may run on ``obj`` and that apply to it now: (verb, url)."""
        now = timezone.now()
        one = NotificationEntity.objects.filter(pk=obj.pk)
        return [
            (op.verb, reverse("admin:notifications_retry_notificationentity_triage", args=[obj.pk, op.name]))
            for op in OPERATIONS.values()
            if request.user.has_perm(op.perm)
            and op.eligible(one, now).exists()
            and not (op.name == "requeue" and triage.suppressed_recipients([obj.pk], now=now))
        ]

    @admin.action(description="Requeue selected dead letters (retry now)…", permissions=["requeue"])
    def requeue_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._bulk(request, OPERATIONS["requeue"], queryset)

    @admin.action(description="Discard selected dead letters…", permissions=["discard"])
    def discard_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._bulk(request, OPERATIONS["discard"], queryset)

    def triage_one(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """Requeue or discard one notification from its detail page, after a confirmation page."""
        op = OPERATIONS.get(operation)
        if op is None:
            raise PermissionDenied
        if not request.user.has_perm(op.perm):
            raise PermissionDenied
        obj = get_object_or_404(NotificationEntity, pk=_uuid_or_404(object_id))
        change_url = reverse("admin:notifications_retry_notificationentity_change", args=[obj.pk])
        form = ReasonForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            self._run(request, op, [obj.pk], form.cleaned_data["reason"])
            return HttpResponseRedirect(change_url)
        return self._confirmation(
            request, op, NotificationEntity.objects.filter(pk=obj.pk), form, hidden=[], cancel_url=change_url
        )

    def _bulk(
        self, request: HttpRequest, op: TriageOperation, queryset: QuerySet[Any]
    ) -> HttpResponse | None:
        if not request.user.has_perm(op.perm):
            raise PermissionDenied
        cap = BULK_ACTION_CAP
        across = request.POST.get("select_across") == "1"
        total = queryset.count()
        if total > cap:
            self.message_user(
                request,
                f"{total} notifications match; the cap for one action is {cap}. "
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
        now = timezone.now()
        eligible_rows = op.eligible(_notifications(queryset), now)
        eligible = eligible_rows.count()
        # A requeue refuses a suppressed recipient too: at most BULK_ACTION_CAP rows, two statements.
        suppressed = 0
        if op.name == "requeue" and eligible:
            ids = list(eligible_rows.values_list("pk", flat=True))
            suppressed = len(triage.suppressed_recipients(ids, now=now))
            eligible -= suppressed
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
            "suppressed": suppressed,
            "across": across,
            "sample": [(obj, mask_recipient(obj.recipient), status_badge(obj)) for obj in sample],
            "more": max(0, total - len(sample)),
            "cancel_url": cancel_url,
            "cap": BULK_ACTION_CAP,
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
