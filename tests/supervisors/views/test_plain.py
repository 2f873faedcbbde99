"""supervisors/views/plain.py: the summary off a terminal, drawn without rich, is what rich draws
there, character for character (rich draws the reference here, in the test's process); where it
could differ, plain.py declines and the view draws with rich."""

from __future__ import annotations

import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from actor_run.supervisors.views.live import View
from actor_run.supervisors.views.plain import summary_text
from actor_run.supervisors.views.summary import SUMMARY_COLUMNS, SUMMARY_WIDTH


def by_rich(header: str, rows: list[tuple[str, ...]], width: int = SUMMARY_WIDTH) -> str:
    """What the view drew with rich (live.py before plain.py): a Console on a file, no terminal."""
    out = io.StringIO()
    console = Console(file=out, highlight=False, width=width)
    t = Table(title="summary", expand=False)
    for col in SUMMARY_COLUMNS:
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    console.print(header, markup=False)
    if rows:
        console.print(t)
    return out.getvalue()


def plain(header: str, rows: list[tuple[str, ...]], width: int = SUMMARY_WIDTH,
          environ: dict[str, str] | None = None, encoding: str | None = "utf-8") -> str | None:
    return summary_text(header, SUMMARY_COLUMNS, rows, width=width, environ=environ or {}, encoding=encoding)


ROW = ("seeds/seed-1", "succeeded", "1", "local this-computer", "", "2.4s", "$0.0000")
FAILED = ("t/seed-2", "failed", "3", "sim us-east H100", "job_failed: exit 1", "12.4s", "$0.1000")
HEADER = "3/3 done: 2 ok, 1 failed | $0.1000 spent | elapsed 0:13, left ~0:00"


def test_a_run_summary_is_rich_s_to_the_character() -> None:
    for rows in ([], [ROW], [ROW, FAILED], [FAILED] * 3):
        assert plain(HEADER, rows) == by_rich(HEADER, rows)


# text as the view's cells hold it: words of letters, digits and the punctuation of keys, places,
# failures and figures, and now and then what rich would read otherwise (markup, emoji, wide
# characters, doubled or edge spaces, tabs)
_WORD = st.one_of(st.text(alphabet=st.sampled_from("abcxyz019-_./$%()"), min_size=1, max_size=10),
                  st.sampled_from(["job_failed:", "0:13,", "~0:00", "|", "$0.1000"]))
_ODD = st.sampled_from(["[bold]", "[x", "\\[", ":smile:", "a:b:c", "é", "日本", "  ", " lead", "tail ", "\t", "\n"])
_EMOJI_LIKE = re.compile(r":\S*:")  # two colons in one word: plain.py leaves those to rich
_CLEAN = st.lists(_WORD, max_size=3).map(" ".join)
_CELL = st.one_of(*[_CLEAN] * 30, st.tuples(_CLEAN, _ODD, _CLEAN).map("".join))


@settings(max_examples=200, deadline=None)
@given(header=_CLEAN, rows=st.lists(st.tuples(*[_CLEAN] * len(SUMMARY_COLUMNS)), max_size=4),
       width=st.sampled_from([60, 100, SUMMARY_WIDTH]))
def test_plain_text_that_fits_is_drawn_as_rich_draws_it(header: str, rows: list[tuple[str, ...]], width: int) -> None:
    drawn = plain(header, rows, width)
    cells = [list(SUMMARY_COLUMNS), *rows]
    table = sum(max(len(r[i]) for r in cells) + 3 for i in range(len(SUMMARY_COLUMNS))) + 1
    text = " ".join([header, *(c for r in rows for c in r)])
    if len(header) < width and (not rows or table < width) and not _EMOJI_LIKE.search(text):
        assert drawn is not None
    if drawn is not None:
        assert drawn == by_rich(header, rows, width)


@settings(max_examples=200, deadline=None)
@given(header=_CELL, rows=st.lists(st.tuples(*[_CELL] * len(SUMMARY_COLUMNS)), max_size=3),
       width=st.sampled_from([60, 100, SUMMARY_WIDTH]))
def test_whatever_plain_draws_rich_draws_the_same(header: str, rows: list[tuple[str, ...]], width: int) -> None:
    drawn = plain(header, rows, width)
    if drawn is not None:
        assert drawn == by_rich(header, rows, width)


def test_it_declines_where_rich_would_draw_otherwise() -> None:
    assert plain(HEADER, [ROW], environ={"FORCE_COLOR": "1"}) is None  # rich draws styles then
    assert plain(HEADER, [ROW], environ={"TTY_COMPATIBLE": "1"}) is None
    assert plain(HEADER, [ROW], encoding="ascii") is None  # rich's box in ASCII then
    assert plain(HEADER, [(*ROW[:4], "internal: [bold]x[/bold]", *ROW[5:])]) is None  # markup
    assert plain(HEADER, [(*ROW[:4], "x" * 130, *ROW[5:])]) is None  # wider than the console: wrapped
    assert plain("x " * 80, [ROW]) is None
    assert plain(HEADER, [("日本/seed-1", *ROW[1:])]) is None  # two cells a character


def test_the_view_off_a_terminal_prints_the_summary_rich_would() -> None:
    out = io.StringIO()
    view = View(["t/seed-1", "t/seed-2"], json_mode=False, out=out)
    view.summary()
    header, title = out.getvalue().splitlines()[:2]
    assert title.strip() == "summary"
    rows = [("t/seed-1", "queued", "0", "", "", "-", "$0.0000"), ("t/seed-2", "queued", "0", "", "", "-", "$0.0000")]
    assert out.getvalue() == by_rich(header, rows)
