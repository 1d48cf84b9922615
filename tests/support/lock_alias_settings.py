"""Test settings plus a ``lock`` alias at ``NR_TEST_LOCK_DATABASE_URL`` (e.g. a PgBouncer), same database.

For worker subprocesses whose lock connection must go elsewhere than their data connections; name the
alias in ``NOTIFICATIONS_RETRY['LOCK_DATABASE_ALIAS']`` through ``NR_TEST_SETTINGS_JSON``.
"""

from __future__ import annotations

import os

import dj_database_url

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

DATABASES["lock"] = dj_database_url.parse(os.environ["NR_TEST_LOCK_DATABASE_URL"], conn_max_age=0)
DATABASES["lock"]["NAME"] = DATABASES["default"]["NAME"]
