"""Progress bars: redrawn in place on a terminal, plain rate-limited lines in a log."""

from __future__ import annotations

import io

from kohakuclip._progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_whole_lines_not_redraws() -> None:
    log = io.StringIO()
    with progress_bar(log, total=500, unit="video") as bar:
        for _ in range(500):
            bar.update(1)
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    # opened and closed within LOG_INTERVAL: the first line and the last, nothing between
    assert len(lines) == 2 and text.endswith("\n")
    assert "0/500" in lines[0] and "500/500" in lines[1]


def test_a_terminal_gets_a_bar_redrawn_in_place() -> None:
    screen = _Terminal()
    with progress_bar(screen, total=3, unit="video", mininterval=0) as bar:
        for _ in range(3):
            bar.update(1)
    assert screen.getvalue().count("\r") >= 3
    assert "3/3" in screen.getvalue()


def test_a_disabled_bar_writes_nothing() -> None:
    log = io.StringIO()
    with progress_bar(log, total=3, disable=True) as bar:
        bar.update(3)
    assert log.getvalue() == ""
