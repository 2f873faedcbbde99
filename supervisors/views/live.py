"""What `actor-run run` shows while a batch runs: the live view (`View`), which takes the events
and draws the frames (its summary at the end: summary.py).

On a terminal: a header for the batch (succeeded / failed / running / waiting for capacity
/ queued, dollars spent and reserved against the budget, elapsed, an estimate of the time left),
then one row per running job (state, attempt, place, stage, a progress bar from the `step` and
`total` of its progress lines, the latest numeric fields it reported, time in this attempt,
dollars so far, and the retry budgets it drew on, each against its limit: `preemptions 2/6, stalls
1/3`, as `status` says them), then the failed jobs with their codes and budgets. The budgets come
with the job's `Retrying` (said as the next attempt starts) and `JobEnded`: a field set per event,
made into text only for a row drawn. When more jobs run than the terminal has
rows, the rows that changed most recently are shown and the rest counted. Finished jobs fold into
the header's counts.

Fitting the terminal (fit.py): the header is cut to the width, never losing the money, the
budget, elapsed and the time left; a job's row drops its columns.

Log lines at WARNING while the view is on the screen (`warn`, the sink `watch` puts in place of
stderr's) fold into one line of the frame, and are told once each after the batch (log_warnings.py).

Not on a terminal: one plain line per job whose state changed (rows.py `_plain`), and the summary
drawn without rich (summary.py, plain.py: the same characters rich draws there). With `--json`:
every event as one JSON line (nothing else). Neither loads rich: only a terminal's view does.

Cost (bench/load.py --view measures it: under 5 % of the controller's CPU at ten thousand jobs):
events come through a deque the Runner's subscriber appends to, and `follow` takes them every
FRAME_S in one go (a wake-up per event cost more than everything else). `event()` updates one
row and the header's running figures (counts by state, dollars, the sum of progress), so a redraw
costs the same at any N. Progress lines and meter readings, nine events in ten at N=10,000, take
a short way in `follow`'s loop: a line's keys go into its job's fields (each as the last line
that had it said) and the job is marked; at the next redraw a job whose lines give a total is read
(its share of the time left), and the others' stage and step only as their rows are drawn.
What the view costs is that loop: about 1.5 us an event, 2 us on a busy controller (taking the event
from the deque is 1/17 of it; bench/view_replay.py). The screen is drawn at most MAX_REDRAWS_PER_S
times a second, when something changed or (every CLOCK_REDRAW_S) a clock on it moved, as one
write of pre-cut lines (`_Screen`; rich renders the styles for the terminal once). Dollars
accrue between the meter's beats: a running machine's cost is its hourly price times the time
since it was leased (the meter's own arithmetic, `usage_between`), so the view needs no extra
event to show money moving.
"""

from __future__ import annotations

import collections
import itertools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from actor_run.protocols.failures import Code
from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    Event,
    JobEnded,
    Leased,
    LeaseFailed,
    LeaseStage,
    Metered,
    Progress,
    Retrying,
    WaitingForCapacity,
    encode,
    run_line,
)
from actor_run.protocols.specs import job_key
from actor_run.supervisors.tree.budget import BudgetStatistics
from actor_run.supervisors.views.fit import BUDGETS_MAX, columns_for, header_line, terminal_size
from actor_run.supervisors.views.log_warnings import Warnings
from actor_run.supervisors.views.rows import (
    _END_STATES,
    _STATES,
    BAR,
    BOLD,
    CLOCK_REDRAW_S,
    DIM,
    FRAME_S,
    MAX_REDRAWS_PER_S,
    RED,
    YELLOW,
    JobLine,
    ViewStatistics,
    _category,
    _clock,
    _fraction,
    _head,
    _number,
    _plain,
    _row,
    _Screen,
    budgets_text,
)
from actor_run.supervisors.views.summary import SUMMARY_WIDTH, summary_rows, write_summary
from actor_run.supervisors.views.text import printable

if TYPE_CHECKING:  # rich loads on a terminal (and for a summary plain.py cannot draw as rich does)
    from rich.console import Console


# the time left is said only once it can be honest: after ETA_AFTER_S, and once a job has ended
# or ETA_FRACTION of the batch is done (a tenth: at step 9 of 120 it says "-", not "~0:01")
ETA_AFTER_S = 10.0
ETA_FRACTION = 0.1


class View:
    def __init__(self, keys: list[str], *, json_mode: bool, out: TextIO | None = None,
                 budget_usd: float | None = None, budget: Callable[[], BudgetStatistics] | None = None,
                 run_of: Callable[[str], str] | None = None) -> None:
        self.json_mode = json_mode
        self.run_of = run_of  # job key -> its run: every --json line carries `"run": ...`
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.lines = {k: JobLine(key=k) for k in keys}
        self.seeds_of: dict[str, dict[int, JobLine]] = {}  # job -> seed -> line: no string nor tuple built per event
        for k, line in self.lines.items():
            job, seed = _head(k)
            self.seeds_of.setdefault(job, {})[seed] = line
        self.fresh: list[JobLine] = []  # lines with a progress line not read yet
        self._console: Console | None = None
        self.live: _Screen | None = None
        self.budget_usd = budget_usd
        self.budget = budget
        self.began = time.time()
        self.failed_order: list[str] = []
        self.count = {"succeeded": 0, "failed": 0, "canceled": 0, "running": 0, "waiting": 0, "queued": len(self.lines)}
        self.recent: dict[str, JobLine] = {}  # running and waiting jobs, the most recently changed last
        self.progress = 0.0  # the sum of the running jobs' fractions done
        self.usd_done = 0.0  # ended attempts' cost
        self.rate = 0.0  # leased machines: the sum of their dollars per second ...
        self.rate_t = 0.0  # ... and of that times when each was leased (spent = rate * now - rate_t)
        self.dirty = True
        self.next_draw = 0.0
        self.last_draw = 0.0
        self.events = 0
        self.redraws = 0
        self.cpu_s = 0.0
        self.warnings = Warnings()  # the log's WARNING lines while the frame is on the screen

    @property
    def console(self) -> Console:
        """rich's console on `out`, made at first use (a terminal's view, or a summary for rich)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.out, highlight=False, width=None if self.tty else SUMMARY_WIDTH)
        return self._console

    def __enter__(self) -> View:
        if not self.json_mode and self.tty and not self.console.is_dumb_terminal:  # TERM=dumb: plain lines
            self.live = _Screen(self.console)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None

    def statistics(self) -> ViewStatistics:
        return ViewStatistics(events=self.events, redraws=self.redraws, cpu_s=self.cpu_s)

    # --- events --------------------------------------------------------------------------------

    def event(self, e: Event) -> None:
        """Take one event, on the thread that shows them (follow() calls it; statistics() counts what
        follow() took)."""
        if self.json_mode:
            body = encode(e)
            # flushed by follow() after each batch of events
            self.out.write((run_line(self.run_of(job_key(e.job, e.seed)), body) if self.run_of is not None
                            else body.decode()) + "\n")
            return
        seeds = self.seeds_of.get(e.job)
        line = seeds.get(e.seed) if seeds is not None else None
        if line is None:
            return
        if isinstance(e, Progress):  # most events at a thousand jobs: kept, read at the next redraw
            self._pend(line, e)
            return
        if isinstance(e, Metered):
            line.metered = e.usd
            return
        if line.fresh:
            self._progress(line)
        before, category = line.state, _category(line)
        self._take(line, e)
        if type(e) in _STATES and line.state not in _END_STATES:
            line.state = _STATES[type(e)]
        after = _category(line)
        if after != category:
            self.count[category] -= 1
            self.count[after] += 1
        if after in ("running", "waiting"):
            self.recent.pop(line.key, None)
            self.recent[line.key] = line  # the most recently changed last
        else:
            self.recent.pop(line.key, None)
        self.dirty = True
        if self.live is None and line.state != before:
            self.out.write(_plain(line) + "\n")  # flushed by follow() after each batch of events

    def _take(self, line: JobLine, e: Event) -> None:
        match e:
            case AttemptStarted(offer=o):
                if not line.started:
                    line.started = e.t
                line.attempt, line.attempt_at = e.attempt, e.t
                line.place = printable(" ".join(x for x in (o.cloud, o.region or o.host, o.gpu) if x))
                self._machine_gone(line)
                self.progress -= _fraction(line)
                line.stage, line.stage_said, line.step, line.total, line.fields = "", None, None, None, {}
            case Leased(machine=m):
                self._machine_gone(line)
                line.machine, line.leased_at, line.waiting = m, e.t, False
                self.rate += m.hourly_usd / 3600
                self.rate_t += m.hourly_usd / 3600 * e.t
            case LeaseStage(stage=stage):
                line.state = stage  # booting, waiting for ssh
            case WaitingForCapacity() as w:
                line.state, line.waiting = w.what, True
            case LeaseFailed(failure=failure):
                line.waiting = line.waiting or failure == Code.NO_CAPACITY
            case Retrying(counts=counts):
                line.counts = counts  # its budgets, this failure counted: made into text only as drawn
            case AttemptEnded(usage=u, failure=failure, detail=detail):
                self._machine_gone(line)
                if failure not in (Code.NO_CAPACITY, Code.QUOTA, Code.AMBIGUOUS_CREATE):  # tree/job.py's UNCOUNTED
                    line.attempts += 1
                line.usd_done += u.usd
                self.usd_done += u.usd
                line.waiting = line.waiting or failure == Code.NO_CAPACITY
                line.usd = line.usd_done
                if failure is not None and failure not in (Code.NO_CAPACITY, Code.QUOTA):
                    # why the job is retried (a retriable verdict's reason, the out-of-memory line), until it ends
                    line.failure, line.detail = str(failure), printable(detail)
            case JobEnded(outcome=outcome, failure=failure, detail=detail, usd=usd, attempts=attempts, counts=counts):
                self._machine_gone(line)
                line.counts = counts
                self.progress -= _fraction(line)
                line.attempts = attempts
                line.state = outcome
                line.failure = str(failure) if failure else ""
                line.detail = printable(detail)
                line.ended = e.t
                line.usd = usd
                line.waiting = False
                if outcome == "failed":  # (a canceled job is counted apart, and not listed as failed)
                    self.failed_order.append(line.key)
            case _:
                pass

    def _pend(self, line: JobLine, e: Progress) -> None:
        """A progress line: its keys into the job's fields (each key as the last line that had it said),
        the job marked (`_take_pending` reads it at the next redraw if its lines give a total; its row
        reads it as it is drawn) and its row moved among the most recently changed."""
        if line.ended is None:
            line.fields.update(e.line)
            if not line.fresh:  # its first since the last redraw: the row changed now
                line.fresh = True
                self.fresh.append(line)
                recent = self.recent
                if line.key in recent:
                    del recent[line.key]
                    recent[line.key] = line
            self.dirty = True

    def _progress(self, line: JobLine) -> None:
        """What the job's progress lines said (its fields, each key as the last line that had it
        said): its stage, step and total (its other numbers, e.g. loss, are picked out of its fields
        only for a row on screen). Called for a row about to be drawn, for a job whose lines give a
        total (the header's sum of progress) at each redraw, and before a job's other events: kept
        to a few dictionary operations, and the same again when nothing new came."""
        line.fresh = False
        if line.ended is not None:
            return
        fields = line.fields
        stage = fields.get("stage")
        if stage and stage != line.stage_said:  # the same stage again: nothing to make printable
            line.stage_said = stage
            line.stage = printable(str(stage))
        step, total = fields.get("step"), fields.get("total")
        if total is None and line.total is None:  # no bar (nor a share of the time left) without a total
            if type(step) is int or type(step) is float or _number(step):  # the common cases first
                line.step = step
            return
        before = _fraction(line)
        if _number(step):
            line.step = step
        if _number(total):
            line.total = total
        self.progress += _fraction(line) - before

    def _take_pending(self) -> None:
        """Before a redraw: the jobs that wrote progress lines since the last one. Only a job whose
        lines give a total is read now (its share of the time left moves the header); the others'
        stage and step matter only on a row, read as it is drawn (`_screen`): at N=10,000 nearly
        every job writes between two redraws, and some 50 rows are on screen."""
        fresh, progress = self.fresh, self._progress
        for line in fresh:
            if line.fresh:  # not read already (an event of its job came after it)
                line.fresh = False
                if line.total is not None or "total" in line.fields:
                    progress(line)
        fresh.clear()  # the same list: follow() holds its append

    def _machine_gone(self, line: JobLine) -> None:
        """The attempt's machine stops accruing here (its cost comes with AttemptEnded)."""
        m = line.machine
        if m is not None:
            self.rate -= m.hourly_usd / 3600
            self.rate_t -= m.hourly_usd / 3600 * line.leased_at
            line.machine, line.metered = None, 0.0

    # --- warnings ------------------------------------------------------------------------------

    def warn(self, message: Any) -> None:
        """A loguru sink (any thread): a WARNING line, kept for the frame instead of the terminal."""
        self.warnings.add(message)
        self.dirty = True

    # --- the terminal --------------------------------------------------------------------------

    def due(self) -> float:
        """Seconds until the next redraw may happen (0: now); a large number without a terminal."""
        if self.live is None:
            return 3600.0
        now = time.monotonic()
        if not self.dirty:
            return max(0.0, self.last_draw + CLOCK_REDRAW_S - now)
        return max(0.0, self.next_draw - now)

    def draw(self) -> None:
        """Redraw if due (at most MAX_REDRAWS_PER_S a second)."""
        if self.live is None or self.due() > 0:
            return
        now = time.monotonic()
        self._take_pending()
        width, height = terminal_size(self.out)
        self.live.draw(self._screen(time.time(), height, width), width)
        self.dirty = False
        self.last_draw = now
        self.next_draw = now + 1.0 / MAX_REDRAWS_PER_S
        self.redraws += 1

    def spent_usd(self, now: float) -> float:
        """Ended attempts' cost plus every leased machine's up to `now` (its hourly price since its lease)."""
        return self.usd_done + max(0.0, self.rate * now - self.rate_t)

    def header(self, now: float, width: int | None = None) -> str:
        """The batch in one line (also the summary's first line), cut to `width` as fit.py says.
        Every figure is kept as events come (counts by category, money, the sum of progress), so this
        costs the same at any N."""
        c = self.count
        n = len(self.lines)
        b = self.budget() if self.budget is not None else None  # the batch's reservations (budget.py)
        limit = b.limit_usd if b is not None and b.limit_usd is not None else self.budget_usd
        elapsed = now - self.began
        done = c["succeeded"] + c["failed"] + c["canceled"]
        fraction = done + self.progress
        eta = "-"
        if done == n:
            eta = "0:00"
        elif elapsed >= ETA_AFTER_S and (done or fraction >= ETA_FRACTION * n):
            batch_left = elapsed * (n - fraction) / fraction
            left = self._tail_left(now, batch_left) if not c["queued"] and not c["waiting"] else batch_left
            eta = "-" if left is None else _clock(left)
        return header_line(c, n, spent_usd=self.spent_usd(now), reserved_usd=b.reserved_usd if b is not None else None,
                           limit_usd=limit, elapsed=_clock(elapsed), eta=eta, width=width)

    def _tail_left(self, now: float, batch_left: float) -> float | None:
        """The time left once every job left is running: the longest of their own (the time in the
        attempt over its share done; None while one whose progress gives a total is under
        ETA_FRACTION of it), at least `batch_left`."""
        left = batch_left
        for line in self.recent.values():
            if line.ended is not None:
                continue
            if line.fresh:
                self._progress(line)
            f = line.fraction()
            if f is None:
                continue
            if f < ETA_FRACTION:
                return None
            left = max(left, (now - line.attempt_at) * (1 - f) / f)
        return left

    def _screen(self, now: float, height: int, width: int | None = None) -> list[list[tuple[str, str | None]]]:
        height = max(8, height - 1)
        self.warnings.fold()
        out: list[list[tuple[str, str | None]]] = [[(self.header(now, width), BOLD)]]
        if self.warnings.count:
            out.append([(self.warnings.frame_line(), YELLOW)])
            height -= 1
        failed = self.failed_order
        shown_failed = failed[-max(2, height // 4):][::-1]
        room = height - 2 - len(shown_failed) - (1 if len(failed) > len(shown_failed) else 0) - (1 if failed else 0)
        running = len(self.recent)
        rows = list(itertools.islice(reversed(self.recent.values()), max(1, room - 1)))
        if len(rows) < running and len(rows) > 1:
            rows = rows[:-1]  # one line for the count of the rest
        # the retry budgets' column: only while a row on the frame drew on one, as wide as its longest
        budgets_w = min(BUDGETS_MAX, max((len(budgets_text(line)) for line in rows), default=0))
        if budgets_w:
            budgets_w = max(budgets_w, len("retries"))
        cols = columns_for(width, budgets_w)
        heads = {"att": f" {'att':>3}", "place": f" {'place':<22}", "stage": f" {'stage':<10}",
                 "progress": f" {'progress':<{BAR + 8}}", "budgets": f"  {'retries':<{budgets_w}}",
                 "reported": "  reported"}
        middle = "".join(heads[c] for c in ("att", "place", "stage", "progress") if c in cols)
        out.append([(f"{'job':<24} {'state':<12}{middle} {'in attempt':>10} {'cost':>9}"
                     + "".join(heads[c] for c in ("budgets", "reported") if c in cols), DIM)])
        for line in rows:
            self._progress(line)  # its stage and step as its lines last said them
            out.append(_row(line, now, cols, budgets_w))
        if len(rows) < running:
            out.append([(f"... and {running - len(rows)} more running (most recently changed shown)", DIM)])
        if failed:
            out.append([("failed:", RED)])
            for key in shown_failed:
                line = self.lines[key]
                budgets = budgets_text(line)
                out.append([(f"  {key:<24} ", None), (f"{line.failure:<14}", RED),
                            *([(f" [{budgets}]", YELLOW)] if budgets else []), (f" {line.detail[:100]}", DIM)])
            if len(failed) > len(shown_failed):
                out.append([(f"  ... and {len(failed) - len(shown_failed)} more failed", DIM)])
        return out

    # --- the summary ---------------------------------------------------------------------------

    def summary(self) -> None:
        """After the batch: its header, then a table of its jobs (summary.py); nothing with --json."""
        if self.json_mode:
            return
        self._take_pending()
        rows, more = summary_rows(list(self.lines.values()))
        write_summary(self.header(time.time()), rows, out=self.out, tty=self.tty, console=lambda: self.console,
                      more=more)

    # --- the loop ------------------------------------------------------------------------------

    def follow(self, events: collections.deque[Event], until: Callable[[Event], bool]) -> None:
        """Show the events appended to `events` (subscribe `events.append`: a deque's append takes no
        lock and wakes nobody, so the emitting actor threads pay almost nothing) until `until(event)`
        says the batch is over, redrawing when due. `until` is asked of every event but progress
        lines and meter readings. Its thread's CPU time meanwhile is `statistics().cpu_s`."""
        t0 = time.thread_time()
        try:
            self._follow(events, until)
        finally:
            self.cpu_s += time.thread_time() - t0

    def _follow(self, events: collections.deque[Event], until: Callable[[Event], bool]) -> None:
        # wakes every FRAME_S and takes what came meanwhile in one go: a wake-up per event (a
        # blocking get) cost more than the view's own work at a thousand jobs (a thread switch and
        # the GIL's hand-off each time). Progress lines and meter readings, most of the events, take
        # the short way here.
        take, event, pend = events.popleft, self.event, self._pend
        seeds_of = self.seeds_of
        short = not self.json_mode
        done = False
        while not done:
            time.sleep(FRAME_S)
            n = len(events)  # what came until now; what comes meanwhile waits for the next frame
            for _ in range(n):
                e = take()
                if short and type(e) is Progress:
                    seeds = seeds_of.get(e.job)
                    line = seeds.get(e.seed) if seeds is not None else None
                    if line is not None:
                        pend(line, e)
                    continue
                if short and type(e) is Metered:
                    seeds = seeds_of.get(e.job)
                    line = seeds.get(e.seed) if seeds is not None else None
                    if line is not None:
                        line.metered = e.usd
                    continue
                event(e)
                done = until(e) or done
            self.events += n
            if self.live is None:
                self.out.flush()
            elif not done:
                self.draw()
