"""The run's summary off a terminal (a pipe, a file, a test's capture) without rich: the characters
rich draws there, where it shows no styles (a header line, then a box table under a centred title),
so that `actor-run run` piped or captured does not load rich (about 0.1 s of CPU per process).

`summary_text` answers None wherever rich could draw otherwise than this does: a line it would wrap
(wider than the console), text its markup or emoji codes would read (`[`, `\\`, `:name:`), characters
that are not plain ASCII (wide ones take two cells), cells with edge or doubled spaces, a console
the environment makes a terminal (FORCE_COLOR, TTY_COMPATIBLE), an output that is not UTF-8
(rich draws the box in ASCII then). The caller draws with rich then (summary.py `write_summary`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_EMOJI = re.compile(r":\S*:")  # what rich's emoji codes could match (`:smile:`)
_PLAIN = re.compile(r"[ -Z\]-~]*")  # printable ASCII but `[` and `\` (rich's markup)


def _plain(text: str) -> bool:
    return bool(_PLAIN.fullmatch(text)) and not _EMOJI.search(text) and "  " not in text \
        and text == text.strip()


def summary_text(header: str, columns: Sequence[str], rows: Sequence[Sequence[str]], *, width: int,
                 environ: Mapping[str, str], encoding: str | None) -> str | None:
    """`header` on a line, then `rows` under `columns` in a box titled "summary" (none without rows),
    as rich's Console(width=`width`) prints them off a terminal; None where it could differ."""
    if "FORCE_COLOR" in environ or "TTY_COMPATIBLE" in environ or not (encoding or "utf-8").lower().startswith("utf"):
        return None
    if len(header) >= width or not _plain(header):
        return None
    if not rows:
        return header + "\n"
    cells = [list(columns), *[list(r) for r in rows]]
    if not all(cell == "" or _plain(cell) for row in cells for cell in row):
        return None
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    total = sum(widths) + 3 * len(widths) + 1
    if total >= width:
        return None

    def rule(left: str, line: str, cross: str, right: str) -> str:
        return left + cross.join(line * (w + 2) for w in widths) + right

    def row(cells: Sequence[str], bar: str) -> str:
        return bar + bar.join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + bar

    title = "summary"
    left = (total - len(title)) // 2
    out = [header, " " * left + title + " " * (total - len(title) - left), rule("┏", "━", "┳", "┓"), row(columns, "┃"),
           rule("┡", "━", "╇", "┩"), *[row(r, "│") for r in rows], rule("└", "─", "┴", "┘")]
    return "\n".join(out) + "\n"


__all__ = ["summary_text"]
