"""docs/contract.md lists every public name the code has: a name added without it fails here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from django.core.management import load_command_class
from prometheus_client.metrics import MetricWrapperBase

import notifications_retry
from notifications_retry.conf import RetrySettings
from notifications_retry.observability import metrics

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = (ROOT / "docs" / "contract.md").read_text()
COMMANDS = sorted(
    p.stem
    for p in (ROOT / "notifications_retry" / "management" / "commands").glob("*.py")
    if p.stem != "__init__"
)
#: Options every Django command has (Django's own contract, not this app's).
DJANGO_OPTIONS = {"--help", "--version", "--verbosity", "--settings", "--pythonpath", "--traceback"}
DJANGO_OPTIONS |= {"--no-color", "--force-color", "--skip-checks"}


def listed(name: str) -> bool:
    return f"`{name}`" in CONTRACT or re.search(rf"`[^`]*\b{re.escape(name)}\b[^`]*`", CONTRACT) is not None


def test_every_name_the_package_exports_is_listed():
    assert [n for n in notifications_retry.__all__ if not listed(n)] == []


def test_every_setting_is_listed():
    assert [f.name for f in dataclasses.fields(RetrySettings) if not listed(f.name)] == []


def test_every_metric_is_listed():
    found = [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]
    # A counter is exposed (and named in dashboards) with its _total suffix.
    names = {m._name + ("_total" if m._type == "counter" else "") for m in found}
    assert len(names) > 10
    assert sorted(n for n in names if not listed(n)) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_option_is_listed(command: str):
    parser = load_command_class("notifications_retry", command).create_parser("manage.py", command)
    options = {o for action in parser._actions for o in action.option_strings if o.startswith("--")}
    assert f"`manage.py {command}`" in CONTRACT
    section = CONTRACT.split(f"`manage.py {command}`", 1)[1].split("\n- ", 1)[0]
    assert sorted(o for o in options - DJANGO_OPTIONS if f"`{o}`" not in section) == []


def test_the_check_notices_a_missing_name():
    assert not listed("no_such_public_name")
    assert listed("create_notification")
