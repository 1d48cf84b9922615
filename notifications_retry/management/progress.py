"""A one-line progress bar for long commands: redrawn in place on a terminal, a line at a time in a log."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 30


def progress_line(*, processed: int, total: int, elapsed: float, detail: str = "") -> str:
    """``[#####-----]  40% 80000/200000  2500 rows/s  ETA 48 s`` (the rate and ETA once time has passed)."""
    share = min(1.0, processed / total) if total else 1.0
    filled = round(BAR_WIDTH * share)
    parts = [f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * share:5.1f}% {processed}/{total}"]
    if elapsed > 0 and processed:
        rate = processed / elapsed
        parts.append(f"{rate:.0f} rows/s")
        if total > processed:
            parts.append(f"ETA {(total - processed) / rate:.0f} s")
    if detail:
        parts.append(detail)
    return "  ".join(parts)


class ProgressBar:
    """Draws :func:`progress_line` on ``stream``: in place on a TTY, else at most one line per ``every`` s."""

    def __init__(
        self,
        stream: TextIO,
        *,
        every: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.every = every
        self.monotonic = monotonic
        self.started = monotonic()
        self._last_line = float("-inf")
        self._tty = bool(getattr(stream, "isatty", lambda: False)())

    def update(self, *, processed: int, total: int, detail: str = "", final: bool = False) -> None:
        now = self.monotonic()
        line = progress_line(processed=processed, total=total, elapsed=now - self.started, detail=detail)
        if self._tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
            self.stream.flush()
        elif final or now - self._last_line >= self.every:
            self.stream.write(line + "\n")
            self.stream.flush()
            self._last_line = now
