"""Formatting of the benchmark's tables (plain text, aligned, one row a line)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.costs import Cost


def fmt_list(values: Sequence[float]) -> str:
    return ", ".join(f"{v:,.0f}" for v in values)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def median_cost(costs: Sequence[Cost]) -> Cost:
    """A Cost whose rows/s, WAL and commits are each the median of ``costs`` (same label and rows)."""
    first = costs[0]
    rate = statistics.median(c.rows_per_s for c in costs)

    def median_of(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if len(known) == len(values) else None

    return Cost(
        first.label,
        first.rows,
        first.rows / rate if rate else 0.0,
        int(statistics.median(c.wal_bytes for c in costs)),
        int(statistics.median(c.commits for c in costs)),
        first.wal_range,
        median_of([c.server_cpu_s for c in costs]),
        median_of([c.client_cpu_s for c in costs]),
        median_of([c.cluster_cpu_s for c in costs]),
    )


def cost_row(cost: Cost, rates: Sequence[float] = ()) -> list[str]:
    return [
        cost.label,
        f"{cost.rows:,}",
        f"{cost.rows_per_s:,.0f}",
        _cpu_cell(cost),
        f"{cost.wal_per_row:,.0f}",
        f"{cost.commits_per_row:.3f}",
        f"[{fmt_list(rates)}]" if len(rates) > 1 else "",
    ]


def _cpu_cell(cost: Cost) -> str:
    total = cost.cpu_us_per_row
    if total is None or cost.client_cpu_s is None or cost.cluster_cpu_s is None:
        return "?"
    client = cost.client_cpu_s * 1e6 / cost.rows
    return f"{total:,.0f} ({client:,.0f} + {total - client:,.0f})"


COST_HEADER = [
    "drain",
    "rows",
    "rows/s",
    "CPU µs/row (client + server)",
    "WAL B/row",
    "commits/row",
    "rounds (rows/s)",
]
