"""The recovery command's progress bar: the line's figures, redrawn in place on a TTY, throttled in a log."""

from __future__ import annotations

import io

from notifications_retry.management.progress import ProgressBar, progress_line


def test_the_line_shows_the_share_the_counts_the_rate_and_the_time_left():
    line = progress_line(processed=80_000, total=200_000, elapsed=32.0, detail="requeued 80000, refused 0")
    assert line == (
        "[############------------------]  40.0% 80000/200000  2500 rows/s  ETA 48 s"
        "  requeued 80000, refused 0"
    )


def test_nothing_to_do_is_a_full_bar_and_no_rate_before_any_row():
    assert progress_line(processed=0, total=0, elapsed=1.0).startswith(f"[{'#' * 30}] 100.0% 0/0")
    assert "rows/s" not in progress_line(processed=0, total=10, elapsed=0.0)


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_bar_is_redrawn_in_place_and_ends_with_a_newline():
    stream, now = FakeTTY(), [0.0]
    bar = ProgressBar(stream, monotonic=lambda: now[0])
    now[0] = 1.0
    bar.update(processed=1, total=2)
    bar.update(processed=2, total=2, final=True)
    assert stream.getvalue().count("\r") == 2 and stream.getvalue().endswith("\n")
    assert stream.getvalue().count("\n") == 1


def test_in_a_log_a_line_is_written_at_most_every_few_seconds_and_always_at_the_end():
    stream, now = io.StringIO(), [0.0]
    bar = ProgressBar(stream, every=5.0, monotonic=lambda: now[0])
    for second in range(1, 12):
        now[0] = float(second)
        bar.update(processed=second, total=12)
    bar.update(processed=12, total=12, final=True)
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["1/12", "6/12", "11/12", "12/12"]
