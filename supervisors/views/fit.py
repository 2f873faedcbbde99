"""How much of the live view fits the terminal: its size, and the row columns that fit its width.

The terminal's width as it reports it, else `$COLUMNS`, else 80 (a terminal that says 0 columns:
`script`, `docker run -t`); its height likewise (else `$LINES`, else 24). A job's row drops its
columns in COLUMNS' order: reported, progress, stage, place, attempt; job, state, time in attempt
and cost stay.
"""

from __future__ import annotations

import os
from typing import TextIO

from actor_run.supervisors.views.rows import BAR

# a row's columns that may go, in the order they go when the terminal is narrow, with their widths
# (job 24, state 12, time in attempt 10 and cost 9 always stay: 58 with their spaces)
COLUMNS = ("reported", "progress", "stage", "place", "att")
_WIDTHS = {"reported": 30, "progress": BAR + 9, "stage": 11, "place": 23, "att": 4}
_KEPT = 24 + 1 + 12 + 1 + 10 + 1 + 9 + 1


def columns_for(width: int | None) -> frozenset[str]:
    """The row columns that fit `width` (None: all), dropped in COLUMNS' order."""
    cols = list(COLUMNS)
    if width is not None:
        while cols and _KEPT + sum(_WIDTHS[c] for c in cols) > width - 1:
            cols.pop(0)
    return frozenset(cols)


def terminal_size(out: TextIO) -> tuple[int, int]:
    """(columns, lines) of the terminal `out` is: as it reports them, else $COLUMNS / $LINES, else 80 x 24
    (some terminals report 0 x 0: `script`, `docker run -t`)."""
    try:
        size = os.get_terminal_size(out.fileno())
        width, height = size.columns, size.lines
    except (OSError, ValueError):
        width, height = 0, 0

    def env(name: str) -> int:
        value = os.environ.get(name, "")
        return int(value) if value.isdigit() else 0

    return width or env("COLUMNS") or 80, height or env("LINES") or 24
