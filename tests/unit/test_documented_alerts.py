"""The alert expressions the docs quote are the shipped, tested rules (deploy/prometheus/alerts.yml).

docs/operations.md once suggested ``notifications_retry_circuit_state == 2 for 5m``, a rule that never
fires against a hanging provider (its circuit reads 1 during every probe); the shipped rule is ``> 0``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
# A backticked span that names one of the app's metrics and compares it: an alert condition.
ALERT_SPAN = re.compile(r"`([^`]*\bnotifications_\w+[^`]*(?:>|<|==|!=)[^`]*)`")


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def shipped_expressions() -> list[str]:
    return [squeeze(rule["expr"]) for group in RULES["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_alert_condition_quoted_in_the_docs_is_part_of_a_shipped_rule(doc: Path) -> None:
    prose = re.sub(r"^[ ]*```.*?^[ ]*```$", "", doc.read_text(), flags=re.M | re.S)  # not code blocks
    text = re.sub(r"\n\s*", " ", prose)  # a span may wrap across lines
    for span in ALERT_SPAN.findall(text):
        assert any(squeeze(span) in expr for expr in shipped_expressions()), (
            f"{doc.name} quotes an alert condition that no rule in deploy/prometheus/alerts.yml has: {span!r}"
        )


def test_the_alert_table_lists_every_shipped_rule() -> None:
    table = (ROOT / "docs" / "observability.md").read_text().split("## Alerts", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", table, re.M))
    shipped = {rule["alert"] for group in RULES["groups"] for rule in group["rules"]}
    assert documented == shipped
