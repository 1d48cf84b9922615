"""The delivery guarantee is stated in the same words in the README, docs/guarantees.md and docs/contract.md.

They once disagreed: "at most once, except…" in one, "at-least-once" in another. The sentence is
compared with its line breaks ignored, as Markdown renders it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUARANTEE = (
    "Delivery is at-least-once, and the provider deduplicates by `Idempotency-Key`: a notification "
    "committed to the table is never lost, and is sent twice only when a worker is killed or frozen "
    "(kill -9, OOM, a lost host, a paused VM) between its provider call and the commit of the outcome, "
    "with the same key both times; every final outcome commits with exactly one outbox event."
)
FILES = ["README.md", "docs/guarantees.md", "docs/contract.md"]


def _rendered(path: str) -> str:
    return re.sub(r"\s+", " ", (ROOT / path).read_text())


@pytest.mark.parametrize("path", FILES)
def test_the_guarantee_is_stated_in_the_same_words(path: str) -> None:
    assert GUARANTEE in _rendered(path)


@pytest.mark.parametrize("path", FILES)
def test_no_other_delivery_promise_contradicts_it(path: str) -> None:
    text = _rendered(path).lower()
    assert "at most once —" not in text and "sent at most once" not in text
    assert "exactly-once towards the provider" not in text
