"""Every settings key, every system check id and every public name is documented."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import notifications_retry
from notifications_retry import api
from notifications_retry.conf import GROUPS, REMOVED_KEYS, RetrySettings, bounds

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_DOC = ROOT / "docs" / "settings.md"


def _documented_rows() -> dict[str, str]:
    """Each key's row of the reference, after its name: a group's inner keys as ``GROUP["key"]``."""
    rows = {}
    for line in SETTINGS_DOC.read_text().splitlines():
        match = re.match(r"\|\s*`([A-Z_]+(?:\[\"[a-z_]+\"\])?)`\s*\|(.*)", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def _documented_names() -> list[tuple[str, dataclasses.Field[object]]]:
    """(name in the reference, its field): a plain key's own, each inner key of a group."""
    names: list[tuple[str, dataclasses.Field[object]]] = []
    for field in dataclasses.fields(RetrySettings):
        if field.name in GROUPS:
            names += [(f'{field.name}["{f.name}"]', f) for f in dataclasses.fields(GROUPS[field.name])]
        else:
            names.append((field.name, field))
    return names


@pytest.mark.parametrize("name", [name for name, _ in _documented_names()])
def test_every_settings_key_has_a_row_in_the_reference(name: str) -> None:
    assert name in _documented_rows(), f"{name} is missing from docs/settings.md"


@pytest.mark.parametrize(
    ("name", "field"), _documented_names(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_documented_default_matches_the_code(name: str, field: dataclasses.Field[object]) -> None:
    row = _documented_rows()[name]
    if field.default is not dataclasses.MISSING:
        default = field.default
    else:
        assert field.default_factory is not dataclasses.MISSING
        default = field.default_factory()
    expected = {dict: "{}", tuple: "()"}.get(type(default)) if not default else None
    shown = expected or (repr(default) if not isinstance(default, str) else f'"{default}"')
    assert f"`{shown}`" in row, f"{name}: expected default `{shown}` in its row: {row}"


@pytest.mark.parametrize("name", [name for name, _ in _documented_names()])
def test_every_row_says_when_an_operator_would_change_it(name: str) -> None:
    cells = [cell.strip() for cell in _documented_rows()[name].split(" | ")]
    # Type, Default, Meaning, When to change it: the last one says when, in a sentence.
    assert len(cells) == 4 and cells[-1].rstrip(" |").endswith("."), f"{name}: {cells}"


def test_the_reference_documents_no_key_the_code_lacks() -> None:
    assert set(_documented_rows()) - {name for name, _ in _documented_names()} == set()


def test_the_reference_lists_no_removed_key() -> None:
    # Removed keys are listed once, in docs/upgrading.md, with what became of each.
    text = SETTINGS_DOC.read_text()
    assert [key for key in REMOVED_KEYS if f"`{key}`" in text] == []
    upgrading = (ROOT / "docs" / "upgrading.md").read_text()
    assert [key for key in REMOVED_KEYS if f"`{key}`" not in upgrading] == []


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


@pytest.mark.parametrize(
    ("name", "bound"),
    list(bounds.SETTINGS.items())
    + [
        (f'{group}["{key}"]', bound) for group, inner in bounds.GROUPS.items() for key, bound in inner.items()
    ],
)
def test_documented_range_matches_the_code(name: str, bound: bounds.Bound) -> None:
    row = _documented_rows()[name]
    assert f"| {bound.describe()} |" in f"|{row}", f"{name}: expected range {bound.describe()!r} in: {row}"


@pytest.mark.parametrize(("field", "bound"), list(bounds.CHANNEL_FIELDS.items()))
def test_channel_field_ranges_are_documented(field: str, bound: bounds.Bound) -> None:
    rows = [line for line in SETTINGS_DOC.read_text().splitlines() if line.startswith(f"| `{field}` |")]
    assert len(rows) == 1, f"{field} needs one row in the channel fields table"
    assert bound.describe() in rows[0], f"{field}: expected {bound.describe()!r} in: {rows[0]}"
