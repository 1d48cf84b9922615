"""The README is a landing page: short, its links resolve, and what it moved out lives in docs/.

It once held 596 lines, half of them a performance report that docs/performance.md holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a document's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= 250


def test_the_two_commands_come_first() -> None:
    first_block = README.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands[0] == "make demo" and "make test" in commands


@pytest.mark.parametrize(("target", "anchor"), sorted(set(LINK.findall(README))), ids=str)
def test_every_link_resolves(target: str, anchor: str) -> None:
    if target.startswith("http"):
        return
    path = ROOT / target
    assert path.exists(), target
    if anchor:
        assert anchor in _anchors(path.read_text()), f"{target}#{anchor}"


def test_the_performance_report_lives_in_docs_only() -> None:
    assert "| figure | result | target |" not in README
    assert "docs/performance.md" in README
