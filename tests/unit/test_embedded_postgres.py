"""The example project's embedded PostgreSQL says what to do when pgserver cannot be imported."""

from __future__ import annotations

import sys

import pytest

from example_project import embedded_postgres


def test_without_pgserver_the_demo_says_to_set_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail as it does where pgserver is not installed (Python 3.13:
    # it publishes no wheel there).
    monkeypatch.setitem(sys.modules, "pgserver", None)
    with pytest.raises(RuntimeError, match="set DATABASE_URL") as raised:
        embedded_postgres.database_url(embedded_postgres.data_dir())
    assert str(raised.value) == embedded_postgres.MISSING
    assert isinstance(raised.value.__cause__, ImportError)
