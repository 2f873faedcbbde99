"""The table `actor-run run` prints after a batch (`View.summary`, live.py): the batch's header line,
then one row per job (every job up to 100 of them; past that, at most 100 that did not succeed, and
a line counting the rest) with its state, attempts, place, failure, elapsed time and cost. A screen
too narrow for them all loses, in this order, elapsed, place, attempts and failure before a job's
name is cut (`fitting`).

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


MAX_ROWS = 100  # a summary's table at most; the rest is one line of counts (`status` lists every job)


def summary_rows(lines: Collection[JobLine]) -> tuple[list[tuple[str, ...]], str]:
    """The table's rows, and a line saying what they leave out ("" for nothing): every job up to
    MAX_ROWS of them; past that, the ones that did not succeed, those that failed before those
    canceled, at most MAX_ROWS (a Ctrl-C at 100,000 seeds cancels tens of thousands: a table of
    them all took rich a minute to draw and no one could read it)."""
    listed = list(lines)
    if len(listed) > MAX_ROWS:
        listed = sorted((line for line in listed if line.state != "succeeded"),
                        key=lambda line: line.failure == "canceled")
    shown, rest = listed[:MAX_ROWS], listed[MAX_ROWS:]
    rows: list[tuple[str, ...]] = [
        (line.key, line.state, str(line.attempts), line.place,
         f"{line.failure}: {line.detail}"[:60] if line.failure else "", _elapsed(line), f"${line.usd:.4f}")
        for line in shown]
    if not rest:
        return rows, ""
    kinds: dict[str, int] = {}
    for line in rest:
        kinds[line.failure or line.state] = kinds.get(line.failure or line.state, 0) + 1
    counts = ", ".join(f"{n:,} {kind}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
    return rows, f"... and {len(rest):,} more not shown ({counts}): `actor-run status` lists every job"


def write_summary(header: str, rows: list[tuple[str, ...]], *, out: TextIO, tty: bool,
                  console: Callable[[], Console], more: str = "") -> None:
    """`header` on a line, then `rows` in a table titled "summary" (none without rows), then `more`
    (what the rows leave out) on a line: as plain text off a terminal where plain.py can draw it,
    else with rich on `console()`."""
    columns, rows = fitting(rows, SUMMARY_WIDTH if not tty else console().width)
    text = None if tty else summary_text(header, columns, rows, width=SUMMARY_WIDTH,
                                         environ=os.environ, encoding=getattr(out, "encoding", None))
    if text is not None:
        out.write(text + (more + "\n" if more else ""))
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
    if more:
        console().print(more, markup=False, highlight=False)


__all__ = ["DROPPED_FIRST", "MAX_ROWS", "SUMMARY_COLUMNS", "SUMMARY_WIDTH", "fitting", "summary_rows", "write_summary"]
