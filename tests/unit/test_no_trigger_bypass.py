"""The app's own code never turns its database guards off: every write it makes passes the triggers."""

from __future__ import annotations

from pathlib import Path

import notifications_retry

PACKAGE = Path(notifications_retry.__file__).parent


def test_no_module_of_the_app_uses_pgtrigger_ignore():
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and "pgtrigger.ignore" in path.read_text()
    ]
    assert offenders == []
