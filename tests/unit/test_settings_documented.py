"""Every settings key, every system check id and every public name is documented."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import notifications_retry
from notifications_retry import api, bounds
from notifications_retry.conf import RetrySettings

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_DOC = ROOT / "docs" / "settings.md"


def _documented_rows() -> dict[str, str]:
    rows = {}
    for line in SETTINGS_DOC.read_text().splitlines():
        match = re.match(r"\|\s*`([A-Z_]+)`\s*\|(.*)", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(RetrySettings)])
def test_every_settings_key_has_a_row_in_the_reference(field: str) -> None:
    assert field in _documented_rows(), f"{field} is missing from docs/settings.md"


@pytest.mark.parametrize("field", dataclasses.fields(RetrySettings), ids=lambda f: f.name)
def test_documented_default_matches_the_code(field: dataclasses.Field[object]) -> None:
    row = _documented_rows()[field.name]
    if field.default is not dataclasses.MISSING:
        default = field.default
    else:
        assert field.default_factory is not dataclasses.MISSING
        default = field.default_factory()
    expected = {dict: "{}", tuple: "()"}.get(type(default)) if not default else None
    shown = expected or (repr(default) if not isinstance(default, str) else f'"{default}"')
    assert f"`{shown}`" in row, f"{field.name}: expected default `{shown}` in its row: {row}"


def test_the_reference_documents_no_key_the_code_lacks() -> None:
    known = {f.name for f in dataclasses.fields(RetrySettings)}
    assert set(_documented_rows()) - known == set()


def test_every_check_id_is_documented() -> None:
    source = (ROOT / "notifications_retry" / "checks.py").read_text()
    ids = set(re.findall(r"notifications_retry\.[EW]\d{3}", source))
    text = SETTINGS_DOC.read_text()
    assert ids
    assert {i for i in ids if i not in text} == set()


def test_public_names_resolve_lazily_and_have_docstrings() -> None:
    for name in notifications_retry.__all__:
        value = getattr(notifications_retry, name)
        if callable(value) and not isinstance(value, type):
            assert (value.__doc__ or "").strip(), name
    assert set(api.__all__) <= set(notifications_retry.__all__)


@pytest.mark.parametrize(("name", "bound"), list(bounds.SETTINGS.items()))
def test_documented_range_matches_the_code(name: str, bound: bounds.Bound) -> None:
    row = _documented_rows()[name]
    assert f"| {bound.describe()} |" in f"|{row}", f"{name}: expected range {bound.describe()!r} in: {row}"


@pytest.mark.parametrize(("field", "bound"), list(bounds.CHANNEL_FIELDS.items()))
def test_channel_field_ranges_are_documented(field: str, bound: bounds.Bound) -> None:
    rows = [line for line in SETTINGS_DOC.read_text().splitlines() if line.startswith(f"| `{field}` |")]
    assert len(rows) == 1, f"{field} needs one row in the channel fields table"
    assert bound.describe() in rows[0], f"{field}: expected {bound.describe()!r} in: {rows[0]}"
