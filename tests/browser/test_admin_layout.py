"""The admin fits a 1,440 px screen in Chromium with both sidebars open, and takes the README's screenshots.

"Fits" is measured, not eyeballed: the result table is no wider than the box it scrolls in, and the header
cells of the columns an operator triages by lie inside the viewport.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.browser.conftest import SCREEN
from tests.browser.test_admin_browser import login, seed
from tests.factories import NotificationFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

NOTIFICATIONS = "/admin/notifications_retry/notificationentity/"
CHANNELS = "/admin/notifications_retry/channelconfig/"
TRIAGE_COLUMNS = ("status_badge", "channel", "error_kind_display", "attempts_display", "age")

MEASURE = """(names) => {
  const table = document.querySelector('#result_list');
  const box = table.closest('.results');
  const cells = {};
  for (const name of names) {
    const th = table.querySelector('th.column-' + name);
    cells[name] = th ? [th.getBoundingClientRect().left, th.getBoundingClientRect().right] : null;
  }
  return {
    table: table.scrollWidth, box: box.clientWidth, boxScroll: box.scrollWidth,
    viewport: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
    sidebarOpen: document.querySelector('#nav-sidebar') !== null
      && document.querySelector('#nav-sidebar').getBoundingClientRect().width > 0,
    cells,
  };
}"""


def assert_fits(page: Any, columns: tuple[str, ...]) -> dict[str, Any]:
    """The table needs no horizontal scroll, and each named column's header is on screen."""
    m: dict[str, Any] = page.evaluate(MEASURE, list(columns))
    assert SCREEN["width"] - 20 <= m["viewport"] <= SCREEN["width"], m  # the screen, less any scrollbar
    assert m["sidebarOpen"], "the navigation sidebar is open, as on a first visit"
    assert m["table"] <= m["box"], f"table {m['table']} px wide in a {m['box']} px box: {m}"
    assert m["boxScroll"] <= m["box"], m
    assert m["page"] <= m["viewport"], f"the page scrolls sideways: {m}"
    for name in columns:
        cell = m["cells"][name]
        assert cell is not None, f"no column {name}"
        assert cell[0] >= 0 and cell[1] <= m["viewport"], f"column {name} at {cell}, off screen: {m}"
    return m


def test_notification_list_fits_1440_px_with_long_values(live_server: Any, page: Any) -> None:
    data = seed()
    channel = data["dead"][0].channel
    # The widest values a row can hold: a 64-character error kind, a requeued row, an old one.
    NotificationFactory(
        channel=channel,
        status="failed",
        attempts=3,
        requeue_count=0,
        error_kind="provider_rejected_the_template_because_a_variable_was_missing_x",
        last_error="x",
        dead_lettered_at=timezone.now(),
        created_at=timezone.now() - timedelta(days=40, hours=23),
    )
    login(page, live_server.url)
    page.goto(f"{live_server.url}{NOTIFICATIONS}")
    assert page.locator("#result_list tbody tr").count() == 14
    assert_fits(page, TRIAGE_COLUMNS)
    page.goto(f"{live_server.url}{NOTIFICATIONS}?dead_letter=yes")
    assert_fits(page, TRIAGE_COLUMNS)
    clipped = page.locator("#result_list .nr-clip[title^='provider_rejected']")
    assert clipped.count() == 1
    assert clipped.evaluate("e => e.scrollWidth > e.clientWidth")  # cut with an ellipsis, whole in the title


def test_broken_channel_is_visible_in_the_channel_list(
    live_server: Any, page: Any, screenshot_dir: Path
) -> None:
    seed()
    login(page, live_server.url)
    page.goto(f"{live_server.url}{CHANNELS}")
    assert_fits(page, ("key", "health", "is_enabled", "provider_key"))
    row = page.locator("#result_list tbody tr", has=page.locator("a", has_text=re.compile("^partner_hook$")))
    badge = row.locator(".nr-badge.nr-dead")
    assert badge.inner_text() == "broken"
    box = badge.bounding_box()
    assert box is not None and box["x"] + box["width"] <= SCREEN["width"]
    assert "needs options['url']" in row.locator(".nr-problems").inner_text()
    page.screenshot(path=str(screenshot_dir / "admin-channels.png"), full_page=True)


def x_ticks(page: Any) -> list[str]:
    """The chart's time-axis labels, left to right (SVG text has no innerText)."""
    labels: list[str] = page.locator("svg.nr-chart .nr-x-tick").evaluate_all(
        "els => els.map(e => e.textContent)"
    )
    return labels


def test_dashboard_chart_range_selector(live_server: Any, page: Any) -> None:
    seed()
    login(page, live_server.url)
    page.goto(f"{live_server.url}{NOTIFICATIONS}dashboard/")
    # samples every 15 minutes over the last 24 h: the axis starts at the oldest one still inside the range
    assert x_ticks(page) == ["-18h", "-12h", "-6h", "now"]
    page.click(".nr-ranges a:text-is('1h')")
    page.wait_for_url(re.compile(r"range=1h"))
    assert page.locator("#nr-backlog h2").inner_text() == "Backlog over the last hour"
    assert x_ticks(page) == ["-40m", "-30m", "-20m", "-10m", "now"]  # the last sample before -1h is at -45m
    assert page.locator(".nr-ranges a.selected").inner_text() == "1h"
    # the chart is inside the page: no sideways scroll at 1,440 px
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= SCREEN["width"]


def test_a_channel_form_with_a_malformed_url_shows_its_one_error(
    live_server: Any, page: Any, screenshot_dir: Path
) -> None:
    seed()
    login(page, live_server.url)
    page.goto(f"{live_server.url}{CHANNELS}add/")
    page.fill("#id_key", "partner_hook_2")
    if page.locator("select#id_provider_key").count():
        page.select_option("#id_provider_key", "webhook")
    else:
        page.fill("#id_provider_key", "webhook")
    page.fill("#id_options", '{"url": "htp:/hooks.example.com/notify"}')
    page.click("input[name=_save]")
    page.wait_for_selector("ul.errorlist li")
    errors = page.locator("ul.errorlist li").all_inner_texts()
    assert errors == [
        "the webhook URL must use http or https, not 'htp'",
        "the webhook URL has no host",
    ], errors  # the posted URL's problems only: not the false "needs options['url']"
    m = page.evaluate("() => [document.documentElement.clientWidth, document.documentElement.scrollWidth]")
    assert m[1] <= m[0], f"the form scrolls sideways: {m}"
    page.screenshot(path=str(screenshot_dir / "admin-channel-form.png"), full_page=True)
