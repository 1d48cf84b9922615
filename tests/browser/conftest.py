"""Playwright driving Debian's headless Chromium against pytest-django's live server on 127.0.0.1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The live server listens on the loopback address only (the tests reach nothing else).
os.environ.setdefault("DJANGO_LIVE_TEST_SERVER_ADDRESS", "127.0.0.1")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per test module, stopped with it.

    Playwright's sync API leaves its event loop marked running in this thread while it lives, so every
    later ``asyncio.run`` in the process would refuse to start: a module's browser must not outlive it.
    Django refuses ORM calls from a thread that runs a loop; the browser tests' own ORM calls are allowed
    for that time only, so the rest of the suite still catches an ORM call made from an event loop.
    """
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: run scripts/ensure-chromium (make test does)")
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield chromium
            chromium.close()


#: The screen the admin must fit: a common laptop / office monitor width, both admin sidebars open.
SCREEN = {"width": 1440, "height": 900}


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=SCREEN, locale="en-US")
    context.set_default_timeout(15_000)
    tab = context.new_page()
    yield tab
    context.close()


@pytest.fixture
def screenshot_dir(tmp_path: Path) -> Path:
    """docs/img when NR_UPDATE_SCREENSHOTS=1 or a screenshot is missing there; a temporary folder otherwise.

    Every run takes the screenshots; only a deliberate update (or a first run) rewrites the committed ones,
    so a test run does not leave modified images in the working tree.
    """
    names = (
        "admin-dashboard.png",
        "admin-list.png",
        "admin-detail.png",
        "admin-channels.png",
        "admin-channel-form.png",
        "admin-dead-letter-filters.png",
        "admin-attempt-timeline.png",
    )
    if os.environ.get("NR_UPDATE_SCREENSHOTS") == "1" or not all((DOCS_IMG / n).exists() for n in names):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        return DOCS_IMG
    return tmp_path
