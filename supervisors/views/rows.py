"""The live view's parts (live.py): one job's row (`JobLine`) and what it shows (its category,
progress, clock; its row on the frame, `_row`; its line off a terminal, `_plain`), the styles, the
redraw limits, and `_Screen`, which writes pre-cut lines. rich is loaded by `_Screen` alone (a
terminal): a view off a terminal never loads it."""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any

import msgspec

from actor_run.actors.meter import usage_between
from actor_run.protocols.messages import (
    AttemptStarted,
    BudgetCount,
    Exited,
    Fetched,
    JobStarted,
    Leased,
    LeaseFailed,
    LeaseRequested,
    Machine,
    Released,
    Retrying,
    Stalled,
    TransferFailed,
    Uploaded,
    is_waiting,
)
from actor_run.supervisors.views.text import printable

if TYPE_CHECKING:
    from rich.console import Console

MAX_REDRAWS_PER_S = 4
FRAME_S = 1.0 / MAX_REDRAWS_PER_S  # how often the loop takes the events that came and maybe redraws
CLOCK_REDRAW_S = 1.0  # with nothing new, the clocks on screen (elapsed, time in attempt, dollars) move this often
NOT_FIELDS = frozenset({"stage", "step", "total", "checkpoint", "t", "time", "epoch_total"})
BAR = 12


class JobLine(msgspec.Struct, kw_only=True):
    key: str
    state: str = "queued"
    attempt: int = 0  # the attempt's number (walk steps count here: they are numbered attempts)
    attempts: int = 0  # the attempts it used (walk steps to a place without stock or quota left out)
    place: str = ""
    started: float = 0.0  # the job's first AttemptStarted
    ended: float | None = None
    attempt_at: float = 0.0  # this attempt's AttemptStarted
    machine: Machine | None = None
    leased_at: float = 0.0
    metered: float = 0.0  # the meter's last figure for this attempt
    usd: float = 0.0  # the job's total so far (shown)
    usd_done: float = 0.0  # its ended attempts'
    failure: str = ""
    detail: str = ""
    stage: str = ""
    step: float | None = None
    total: float | None = None
    fields: dict[str, Any] = msgspec.field(default_factory=dict)  # the progress lines' keys, as last said
    waiting: bool = False  # no capacity: walking or waiting for stock until a machine is leased
    fresh: bool = False  # a progress line came since the last redraw (View._pend, View._take_pending)
    stage_said: Any = None  # the stage as the progress lines said it (`stage` is it made printable)
    # each retry budget's count against its limit, as the job's last Retrying or JobEnded said them
    counts: dict[str, BudgetCount] = msgspec.field(default_factory=dict)

    def live_usd(self, now: float) -> float:
        """Dollars so far: ended attempts, plus this attempt's machine up to now (at least the meter's)."""
        live = 0.0
        if self.machine is not None and self.ended is None:
            live = max(self.metered, usage_between(self.machine, self.leased_at, now, confirmed=True).usd)
        return self.usd_done + live

    def fraction(self) -> float | None:
        if self.step is None or not self.total:
            return None
        return max(0.0, min(1.0, self.step / self.total))


def budgets_text(line: JobLine) -> str:
    """The retry budgets the job drew on, each against its limit (`preemptions 2/6, stalls 1/3`, as
    `status` says them); "" for a job that drew on none. Made for a row as it is drawn, never per event."""
    return ", ".join(f"{kind} {c.used}/{c.limit}" for kind, c in line.counts.items() if c.used)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _head(key: str) -> tuple[str, int]:
    """(job, seed) of a job key (`job_key`'s inverse)."""
    name, _, seed = key.rpartition("/seed-")
    return name, int(seed)


def _category(line: JobLine) -> str:
    """Which of the header's counts a job is in."""
    if line.state in _END_STATES:
        return line.state
    if line.state == "queued":
        return "queued"
    return "waiting" if line.waiting else "running"


def _fraction(line: JobLine) -> float:
    """How far a running job has got (0 without step and total); an ended job counts whole elsewhere."""
    if line.ended is not None:
        return 0.0
    return line.fraction() or 0.0


_STATES: dict[type, str] = {
    AttemptStarted: "leasing", LeaseRequested: "leasing", Leased: "uploading", Uploaded: "starting",
    JobStarted: "running", Exited: "fetching", Fetched: "fetched", Stalled: "stopping", Retrying: "retrying",
    LeaseFailed: "lease failed", TransferFailed: "stopping", Released: "released",
}
_END_STATES = ("succeeded", "failed", "canceled")

# styles as rich's style definitions: parsed by `_Screen` (rich) when a frame first uses one
DIM, BOLD = "dim", "bold"
GREEN, RED, YELLOW, CYAN = "green", "red", "yellow", "cyan"
BAR_DONE, BAR_LEFT = "green", "bright_black"


class ViewStatistics(msgspec.Struct, frozen=True, kw_only=True):
    events: int
    redraws: int
    cpu_s: float  # the CPU time of the thread in follow(), while it ran there


def _clock(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}:{s % 60:02d}"



def _row(line: JobLine, now: float, cols: frozenset[str], budgets_w: int = 0) -> list[tuple[str, str | None]]:
    """A running job's row on the frame, as (text, style) pieces: the columns `cols` (fit.py) of it;
    `budgets_w`: the retry budgets' column's width (`budgets_text`), when it is one of `cols`."""
    state_style = YELLOW if line.waiting else CYAN if line.state == "running" else None
    state = ("no capacity" if line.waiting and line.machine is None and not is_waiting(line.state)
             else line.state)
    pieces: list[tuple[str, str | None]] = [
        (f"{line.key[:24]:<24} ", None), (f"{state[:12]:<12}", state_style)]
    middle = "".join(text for c, text in (("att", f" {line.attempt:>3}"), ("place", f" {line.place[:22]:<22}"),
                                          ("stage", f" {line.stage[:10]:<10}")) if c in cols)
    pieces.append((middle + " ", None))
    if "progress" in cols:
        f = line.fraction()
        if f is None:
            pieces.append((f"{'':<{BAR + 8}} ", None))
        else:
            filled = round(f * BAR)
            step = f"{line.step:g}/{line.total:g}"
            pieces += [("━" * filled, BAR_DONE), ("━" * (BAR - filled), BAR_LEFT), (f" {step[:7]:<7} ", None)]
    reported = ""
    if "reported" in cols:
        numbers = ((k, v) for k, v in line.fields.items() if _number(v) and k not in NOT_FIELDS)
        # a key is the job's own text: shown, never obeyed (an escape in a key reached the terminal raw)
        reported = "  " + " ".join(f"{printable(str(k))}={v:.4g}" for k, v in itertools.islice(numbers, 3))
    budgets = f"  {budgets_text(line)[:budgets_w]:<{budgets_w}}" if "budgets" in cols else ""
    pieces.append((f"{_clock(now - line.attempt_at) if line.attempt_at else '-':>10} "
                   f"${line.live_usd(now):>8.4f}", None))
    if budgets:
        pieces.append((budgets, YELLOW if budgets.strip() else None))
    pieces.append((reported, None))
    return pieces


def _plain(line: JobLine) -> str:
    """A job's line off a terminal, written when its state changes."""
    tail = f" {line.failure}: {line.detail}" if line.failure else ""
    budgets = budgets_text(line)
    if budgets:
        tail += f" [{budgets}]"
    return (f"{line.key:<28} {line.state:<11} attempt {line.attempt} {line.place:<24} "
            f"{_elapsed(line):>7} ${line.usd:.4f}{tail}")


def _elapsed(line: JobLine) -> str:
    """The job's time from its first attempt's start to its end (or now), "-" before it started."""
    if not line.started:
        return "-"
    end = line.ended or time.time()
    return f"{end - line.started:.1f}s"

class _Screen:
    """Frames drawn in place on the terminal: each frame moves the cursor back over the last one and
    writes every line in one write (styles as rich renders them for this terminal; none with
    NO_COLOR or on a dumb one). rich's Live did the same through its layout engine, which cost
    more than the rest of the view at a thousand jobs."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.out = console.file
        self.height = 0  # lines of the frame on screen
        self.codes: dict[str | None, tuple[str, str]] = {None: ("", "")}

    def _code(self, style: str | None) -> tuple[str, str]:
        code = self.codes.get(style)
        if code is None:
            from rich.style import Style

            start = ""
            system = self.console._color_system  # what rich found this terminal can show (None: no styles)
            if system is not None and style is not None:
                parsed = Style.parse(style)
                shown = parsed.without_color if self.console.no_color else parsed
                rendered = shown.render("x", color_system=system)
                start = rendered[:rendered.index("x")] if rendered != "x" else ""
            code = self.codes[style] = (start, "\x1b[0m" if start else "")
        return code

    def draw(self, lines: list[list[tuple[str, str | None]]], width: int) -> None:
        parts = ["\r" + (f"\x1b[{self.height}A" if self.height else "") + "\x1b[?25l"]
        for pieces in lines:
            parts.append("\x1b[2K")
            room = width - 1
            for text, style in pieces:
                if room <= 0:
                    break
                if len(text) > room:
                    text = text[:room]
                room -= len(text)
                start, end = self._code(style)
                parts.append(f"{start}{text}{end}" if start else text)
            parts.append("\n")
        parts.append("\x1b[J")  # what is left of a longer frame before
        self.height = len(lines)
        self.out.write("".join(parts))
        self.out.flush()

    def close(self) -> None:
        """Take the last frame off the screen (the summary follows) and show the cursor again."""
        self.out.write("\r" + (f"\x1b[{self.height}A" if self.height else "") + "\x1b[J\x1b[?25h")
        self.out.flush()
        self.height = 0
