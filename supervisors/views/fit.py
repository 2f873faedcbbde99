"""How much of the live view fits the terminal: its size, the header cut to its width, and the row
columns that fit it.

The terminal's width as it reports it, else `$COLUMNS`, else 80 (a terminal that says 0 columns:
`script`, `docker run -t`); its height likewise (else `$LINES`, else 24). The header is cut to the
width in this order, never losing the money, the budget, elapsed and the time left: (1) the long
words shortened, (2) "reserved" left out, (3) counts of 0 left out, (4) the queued and waiting
counts, (5) the other counts but "done". A job's row drops its columns in COLUMNS' order:
reported, retry budgets (a column only while a row on the frame drew on one), progress, stage,
place, attempt; job, state, time in attempt and cost stay.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO

from actor_run.supervisors.views.rows import BAR

# a row's columns that may go, in the order they go when the terminal is narrow, with their widths
# (job 24, state 12, time in attempt 10 and cost 9 always stay: 58 with their spaces)
COLUMNS = ("reported", "budgets", "progress", "stage", "place", "att")
_WIDTHS = {"reported": 30, "progress": BAR + 9, "stage": 11, "place": 23, "att": 4}
BUDGETS_MAX = 40  # the retry budgets' column is as wide as its longest text on the frame, at most this
_KEPT = 24 + 1 + 12 + 1 + 10 + 1 + 9 + 1


def header_line(counts: Mapping[str, int], n: int, *, spent_usd: float, reserved_usd: float | None,
                limit_usd: float | None, elapsed: str, eta: str, width: int | None) -> str:
    """The batch's header: `counts` of its `n` jobs by category, its money (`reserved_usd` None:
    no budget's reservations to show), `elapsed` and the time left `eta`; cut to `width` (None: whole)
    in the order the module docstring states."""
    c = counts
    done = c["succeeded"] + c["failed"] + c.get("canceled", 0)
    text = ""
    for level in range(6):
        long = level == 0
        named = [("succeeded" if long else "ok", c["succeeded"], 5), ("failed", c["failed"], 5),
                 *([("canceled", c["canceled"], 5)] if c.get("canceled") else []),
                 ("running", c["running"], 5), ("waiting for capacity" if long else "waiting", c["waiting"], 4),
                 ("queued", c["queued"], 4)]
        shown = [f"{v} {name}" for name, v, drop_at in named if level < drop_at and (level < 3 or v)]
        money = f"${spent_usd:.4f} spent"
        if reserved_usd is not None and level < 2:
            money += f", ${reserved_usd:.4f} reserved"
        if limit_usd is not None:
            money += f", budget ${limit_usd:.2f}"
        text = (f"{done}/{n} done" + (": " + ", ".join(shown) if shown else "")
                + f" | {money} | elapsed {elapsed}, left ~{eta}")
        if width is None or len(text) <= width - 1:
            break
    return text


def columns_for(width: int | None, budgets: int = 0) -> frozenset[str]:
    """The row columns that fit `width` (None: all), dropped in COLUMNS' order. `budgets`: the width
    of the retry budgets' text (0: no row on the frame drew on one, no such column)."""
    cols = [c for c in COLUMNS if c != "budgets" or budgets]
    widths = {**_WIDTHS, "budgets": budgets + 2}
    if width is not None:
        while cols and _KEPT + sum(widths[c] for c in cols) > width - 1:
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
