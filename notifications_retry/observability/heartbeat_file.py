"""A worker process's own heartbeat, on its local disk: what a pod's liveness probe reads.

The lane's heartbeat row (:mod:`.liveness`) says whether the lane completes ticks. With several
workers on one lane (``PARTITIONS`` > 1, or standbys) every worker writes that one row, so a probe
reading it passes on a hung pod as long as another pod ticks. ``retry_worker --heartbeat-file PATH``
makes the process also write a small file at each tick's start and end and at least every
:data:`BEAT_SECONDS` while it waits; ``retry_worker --check --heartbeat-file PATH`` is healthy only when
that file is fresh, so the probe judges the process it runs beside, not the lane.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BEAT_SECONDS", "HeartbeatFile", "read_age"]

#: How long a waiting worker goes at most without writing its file: far under the probe's max age.
BEAT_SECONDS = 10.0


class HeartbeatFile:
    """Writes ``{"pid", "lane", "partitions", "at"}`` to ``path``, whole or not at all."""

    def __init__(self, path: str | os.PathLike[str], *, lane: str) -> None:
        self.path = Path(path)
        self.lane = lane
        #: Wall time of the last write (``at``), so waits know when the next one is due.
        self.written_at: float | None = None
        #: The last write failed (logged once, until one succeeds).
        self.failing = False

    def beat(self, now: float, partitions: Sequence[int] | None = None) -> None:
        """Write the file (a rename over the old one, so a probe never reads half of it)."""
        body = {"pid": os.getpid(), "lane": self.lane, "partitions": list(partitions or []), "at": now}
        directory = self.path.parent
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(body, handle)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.written_at = now

    def try_beat(self, now: float, partitions: Sequence[int] | None, log: Any) -> None:
        """:meth:`beat`, a failure logged once (``heartbeat-file-failed``) until a write succeeds: the
        probe then fails, and the worker keeps working."""
        try:
            self.beat(now, partitions)
        except OSError as exc:
            if not self.failing:
                log.warning("heartbeat-file-failed", lane=self.lane, path=str(self.path), error=str(exc))
            self.failing = True
        else:
            self.failing = False

    def due(self, now: float) -> bool:
        """Whether a waiting worker should write again."""
        return self.written_at is None or now - self.written_at >= BEAT_SECONDS


def read_age(path: str | os.PathLike[str], now: float) -> tuple[float, dict[str, object]]:
    """Seconds since the file's last write, and what it says; ``OSError`` or ``ValueError`` when it
    cannot be read (missing, unreadable, not this module's JSON)."""
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(body, dict) or not isinstance(body.get("at"), int | float):
        raise ValueError("not a heartbeat file: no 'at' time")
    return now - float(body["at"]), body
