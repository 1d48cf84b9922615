"""A recovery job from the admin in Chromium at 1,440 px: the list's filter carried to the start form, the
job's page with its progress bar, the job list fitting the screen."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from notifications_retry.delivery import recovery
from notifications_retry.models import RecoveryJob
from tests.browser.test_admin_browser import login, seed
from tests.browser.test_admin_layout import assert_fits
from tests.factories import ChannelFactory
from tests.support.dead_letters import seed_dead_letters

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_start_a_recovery_from_the_list_filter_and_watch_its_progress(
    live_server: Any, page: Any, tmp_path: Path
) -> None:
    seed()
    hook = ChannelFactory(key="partner", max_attempts=5)
    seed_dead_letters(hook, 1200, first=datetime(2026, 3, 1, 2, tzinfo=UTC), step_us=1_000_000)
    base = live_server.url
    login(page, base)
    page.goto(
        f"{base}/admin/notifications_retry/notificationentity/?channel__id__exact={hook.pk}"
        "&dead_letter=unresolved&dead_lettered_at__from=2026-03-01&dead_lettered_at__to=2026-03-01"
    )
    page.click("#nr-recover-all")
    assert page.locator("#nr-matching").inner_text() == "1200"
    assert page.locator("#id_since").input_value() == "2026-03-01T00:00:00+00:00"
    page.fill("#id_reason", "partner back after its outage")
    page.click("input[name=_start]")
    page.wait_for_url("**/recoveryjob/*/change/")
    job = RecoveryJob.objects.get()
    assert (job.channel_id, job.total, job.started_by) == (hook.pk, 1200, "operator")
    assert page.locator("#nr-waiting").is_visible()

    recovery.begin(job.pk)
    recovery.run_chunk(job.pk, chunk_size=300)
    page.reload()
    bar = page.locator(".nr-progress progress")
    assert bar.is_visible() and bar.get_attribute("value") == "300" and bar.get_attribute("max") == "1200"
    assert "25.0% · 300 requeued, 0 refused of 1200" in page.locator(".nr-progress-text").inner_text()
    assert page.locator("#nr-cancel-job").is_visible()
    page.screenshot(path=str(tmp_path / "admin-recovery-job.png"), full_page=True)

    page.goto(f"{base}/admin/notifications_retry/recoveryjob/")
    assert_fits(page, ("channel", "window", "state_badge", "progress_short", "started_by"))
    page.goto(f"{base}/admin/notifications_retry/recoveryjob/{job.pk}/change/")
    page.click("#nr-cancel-job")
    page.wait_for_url(f"**/recoveryjob/{job.pk}/change/")
    job.refresh_from_db()
    assert (job.state, job.done, job.cancelled_by) == ("cancelled", 300, "operator")
    assert page.locator("#nr-cancel-job").count() == 0
