"""Where a drain's WAL bytes go, per relation: ``pg_waldump`` over the drain's LSN range.

Each WAL record's total length (its data plus any full-page image) is charged to the relation of its
first block reference — the table, one of its indexes, its TOAST table — or, for records that touch
no relation (commits, checkpoints), to the record's resource manager. Needs the cluster's WAL files:
only on the benchmark's private cluster.
"""

from __future__ import annotations

import re
from collections import Counter

from bench.cluster import PrivateCluster
from bench.db import connect

_RECORD = re.compile(r"^rmgr: (\w+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+),")
_FIRST_BLOCK = re.compile(r"blkref #0: rel \d+/\d+/(\d+)")

_NAMES = """
SELECT pg_relation_filenode(c.oid), coalesce(owner.relname || ' (TOAST)', c.relname)
FROM pg_class c LEFT JOIN pg_class owner ON owner.reltoastrelid = c.oid
WHERE pg_relation_filenode(c.oid) IS NOT NULL
"""


FULL_PAGE_IMAGES = "(of all the above: full-page images)"


def relation_names() -> dict[str, str]:
    """relfilenode → relation name in the benchmark database (read right after the drain: TRUNCATE
    gives a table new files)."""
    with connect() as conn:
        return {str(node): str(name) for node, name in conn.execute(_NAMES).fetchall()}


def wal_by_relation(cluster: PrivateCluster, wal_range: tuple[str, str]) -> Counter[str]:
    """Bytes of WAL per relation (or resource manager) between the two LSNs, and the part of them that
    is full-page images (under :data:`FULL_PAGE_IMAGES`)."""
    names = relation_names()
    totals: Counter[str] = Counter()
    dump = cluster.waldump(*wal_range)
    assert dump.stdout is not None
    for line in dump.stdout:
        match = _RECORD.match(line)
        if not match:
            continue
        rmgr, record, length = match.groups()
        # Beyond the record's own data, its total is the full-page images it carries.
        totals[FULL_PAGE_IMAGES] += int(length) - int(record)
        block = _FIRST_BLOCK.search(line)
        node = block.group(1) if block else None
        totals[names.get(node, f"relation {node}") if node else f"({rmgr} records)"] += int(length)
    dump.wait()
    return totals
