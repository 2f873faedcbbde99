"""The table `actor-run run` prints after a batch (`View.summary`, live.py): the batch's header line,
then one row per job (every job up to 100 of them; past that, the failed ones) with its state,
attempts, place, failure, elapsed time and cost. A screen too narrow for them all loses, in this
order, elapsed, place, attempts and failure before a job's name is cut (`fitting`).

Off a terminal it is drawn without rich where plain.py can draw it as rich would (the same
characters); on a terminal, or where plain.py declines, rich draws it (loaded only then).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, TextIO

from actor_run.supervisors.views.plain import summary_text
from actor_run.supervisors.views.rows import JobLine, _elapsed

if TYPE_CHECKING:  # rich loads on a terminal (and for a summary plain.py cannot draw as rich does)
    from rich.console import Console

SUMMARY_WIDTH = 140  # the summary's width off a terminal
SUMMARY_COLUMNS = ("job", "state", "attempts", "place", "failure", "elapsed", "cost")
DROPPED_FIRST = ("elapsed", "place", "attempts", "failure")  # on a narrow screen, in this order; job, state, cost stay


def fitting(rows: list[tuple[str, ...]], width: int) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The columns (and the rows cut to them) that fit `width` without cutting a job's name: the
    others go in DROPPED_FIRST's order while the table (its cells, their padding and bars) is wider."""
    columns = list(SUMMARY_COLUMNS)

    def total(cols: list[str]) -> int:
        idx = [SUMMARY_COLUMNS.index(c) for c in cols]
        cells = sum(max([len(c)] + [len(r[i]) for r in rows]) for c, i in zip(cols, idx, strict=True))
        return cells + 3 * len(cols) + 1

    for name in DROPPED_FIRST:
        if total(columns) < width:
            break
        columns.remove(name)
    idx = [SUMMARY_COLUMNS.index(c) for c in columns]
    return tuple(columns), [tuple(r[i] for i in idx) for r in rows]


def summary_rows(lines: Collection[JobLine]) -> list[tuple[str, ...]]:
    """The table's rows: every job up to 100 of them; past that, the ones that did not succeed."""
    if len(lines) > 100:
        lines = [line for line in lines if line.state != "succeeded"]
    return [(line.key, line.state, str(line.attempts), line.place,
             f"{line.failure}: {line.detail}"[:60] if line.failure else "", _elapsed(line), f"${line.usd:.4f}")
            for line in lines]


def write_summary(header: str, rows: list[tuple[str, ...]], *, out: TextIO, tty: bool,
                  console: Callable[[], Console]) -> None:
    """`header` on a line, then `rows` in a table titled "summary" (none without rows): as plain text
    off a terminal where plain.py can draw it, else with rich on `console()`."""
    columns, rows = fitting(rows, SUMMARY_WIDTH if not tty else console().width)
    text = None if tty else summary_text(header, columns, rows, width=SUMMARY_WIDTH,
                                         environ=os.environ, encoding=getattr(out, "encoding", None))
    if text is not None:
        out.write(text)
        out.flush()
        return
    from rich.table import Table

    t = Table(title="summary", expand=False)
    for col in columns:  # a job's name is never cut (folded onto a second line at worst)
        name_width = max([len(col)] + [len(r[0]) for r in rows])
        t.add_column(col, overflow="fold", min_width=name_width if col == "job" else None)
    for row in rows:
        t.add_row(*row)
    console().print(header, markup=False)
    if rows:
        console().print(t)


__all__ = ["DROPPED_FIRST", "SUMMARY_COLUMNS", "SUMMARY_WIDTH", "fitting", "summary_rows", "write_summary"]
