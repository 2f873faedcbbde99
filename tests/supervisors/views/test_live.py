"""supervisors/views/live.py: `actor-run run` on a real pseudo-terminal (the view draws with rich), a sim
batch of the example trainer: the header's counts add up to the batch, progress bars move, dollars
accrue before any job ends, and a Ctrl-C typed on the terminal still exits 130 with every machine
deleted."""

from __future__ import annotations

import collections
import io
import re
import shutil
import time
from pathlib import Path

import pytest
from support.terminal import Terminal
from test_cli import ENV, ROOT, Paths

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    BudgetCount,
    Event,
    JobEnded,
    JobStarted,
    Leased,
    LeaseFailed,
    Machine,
    Metered,
    Offer,
    Progress,
    Retrying,
    Usage,
)
from actor_run.supervisors.views.live import View

BATCH = """\
[job]
name = "t"
command = "python3 train.py --seed {{seed}} --steps 400 --step-seconds 0.05"
code = "{code}"
inputs = {{ data = "{data}" }}
seeds = [1, 2, 3, 4, 5]

[policy]
concurrency = 3
poll_s = 0.2
setup_grace_s = 60
budget_usd = 50.0

[[candidates]]
cloud = "sim"
gpu = "H100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.2
"""

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")
HEADER = re.compile(r"(?<![\d.])(\d+)/(\d+) done: (\d+) succeeded, (\d+) failed, (\d+) running, "
                    r"(\d+) waiting for capacity, (\d+) queued \| "
                    r"\$([0-9.]+) spent, \$[0-9.]+ reserved, budget \$50\.00")
ROW = re.compile(r"(t/seed-\d)\s+running\s+\d+ sim \S+ H100\s+train\s+━+\s*(\d+)/400\s+\d+:\d\d \$\s*([0-9.]+)")


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)


def test_the_live_view_on_a_terminal_then_ctrl_c(paths: Paths) -> None:
    shutil.copytree(ROOT / "examples" / "trainer", paths.tmp / "trainer")
    body = BATCH.format(code=paths.tmp / "trainer", data=ROOT / "examples" / "data" / "train.txt")
    (paths.tmp / "batch.toml").write_text(body)
    env = {**ENV, "TERM": "xterm-256color"}
    env.pop("COLUMNS", None)
    # controlling: a session of its own whose controlling terminal is the pty, so ^C typed there is SIGINT
    with Terminal(paths.run_args(paths.tmp / "batch.toml"), env=env, rows=40, cols=160, stderr=False,
                  controlling=True) as term:
        def rows(text: str) -> dict[str, list[tuple[int, float]]]:
            seen: dict[str, list[tuple[int, float]]] = {}
            for m in ROW.finditer(text):
                seen.setdefault(m.group(1), []).append((int(m.group(2)), float(m.group(3))))
            return seen

        def moved_and_paid(text: str) -> bool:
            # some job's bar moved while none had ended, and the header's dollars grew meanwhile
            unended = [h for h in HEADER.findall(text) if h[0] == "0"]
            return (any(len({step for step, _ in r}) >= 2 for r in rows(text).values())
                    and len({h[7] for h in unended if float(h[7]) > 0}) >= 2)

        term.wait_for(lambda text: moved_and_paid(ANSI.sub("", text)), 60,
                      "a progress bar that moved and dollars that grew before any job ended")
        text = ANSI.sub("", term.text())
        headers = HEADER.findall(text)
        assert headers
        for done, n, ok, failed, running, waiting, queued, _ in headers:
            assert int(n) == 5
            assert int(ok) + int(failed) + int(running) + int(waiting) + int(queued) == 5
            assert int(done) == int(ok) + int(failed)
        assert any(h[6] == "2" for h in headers)  # concurrency 3 of 5: two wait their turn
        for seen in rows(text).values():  # a job's bar and dollars only go forward
            assert [s for s, _ in seen] == sorted(s for s, _ in seen)
            assert [usd for _, usd in seen] == sorted(usd for _, usd in seen)
        term.write(b"\x03")  # Ctrl-C, typed on its terminal
        code = term.wait(60)
        assert term.proc.stderr is not None
        err = term.proc.stderr.read().decode()
    assert code == 130, err
    assert "canceling; deleting every machine" in err
    rows_ = paths.status()
    assert rows_
    assert {r["state"] for r in rows_} == {"deleted"}
    assert sim_machines((paths.state / "sim").resolve()) == []


def _events_of_a_batch(n: int, t: float) -> list[Event]:
    offer = Offer(cloud="sim", region="us-east", gpu="H100", hourly_usd=3.6)
    machine = Machine(cloud="sim", id="m", name="m", hourly_usd=3.6, deadline=t + 3600)
    out: list[Event] = []
    for i in range(n):
        out.append(AttemptStarted(job="t", seed=i, offer=offer, t=t))
        if i != 9:  # seed 9 finds no capacity (below)
            out += [Leased(job="t", seed=i, machine=machine, t=t), JobStarted(job="t", seed=i, pid=1, t=t)]
    return out


def test_more_running_jobs_than_rows_show_the_latest_changed_and_count_the_rest() -> None:
    t = time.time() - 10
    view = View([f"t/seed-{i}" for i in range(100)], json_mode=False, out=io.StringIO())
    for e in _events_of_a_batch(60, t):
        view.event(e)
    view.event(Progress(job="t", seed=7, stage="train", line={"stage": "train", "step": 5, "total": 20}, t=t + 1))
    view.event(Progress(job="t", seed=7, stage="eval", line={"stage": "eval", "loss": 0.25}, t=t + 1))  # no step
    view.event(AttemptEnded(job="t", seed=3, outcome="failed", failure=Code.PREEMPTED, t=t + 2,
                            usage=Usage(usd=0.01)))
    view.event(JobEnded(job="t", seed=3, outcome="failed", failure=Code.JOB_FAILED, detail="exit 1", t=t + 2))
    view.event(AttemptEnded(job="t", seed=4, outcome="succeeded", t=t + 2, usage=Usage(usd=0.01)))
    view.event(JobEnded(job="t", seed=4, outcome="succeeded", t=t + 2, usd=0.01))
    view.event(LeaseFailed(job="t", seed=9, failure=Code.NO_CAPACITY, t=t + 3))
    view._take_pending()
    assert view.count == {"succeeded": 1, "failed": 1, "canceled": 0, "running": 57, "waiting": 1, "queued": 40}
    screen = ["".join(text for text, _ in line) for line in view._screen(t + 10, 20)]
    assert len(screen) <= 20
    header = screen[0]
    assert "2/100 done: 1 succeeded, 1 failed, 57 running, 1 waiting for capacity, 40 queued" in header
    # 57 machines for 10 s at $3.6/h, and two that ended ($0.01 each, as their AttemptEnded said)
    spent = float(re.search(r"\| \$([0-9.]+) spent \|", header).group(1))  # type: ignore[union-attr]
    assert spent == pytest.approx(0.02 + 57 * 0.01, abs=1e-4)
    rows = [s for s in screen if s.startswith("t/seed-")]
    assert rows[0].startswith("t/seed-9 ")  # the latest change first: its lease found no capacity
    assert "no capacity" in rows[0]
    assert rows[1].startswith("t/seed-7 ")
    assert " eval " in rows[1]
    assert "5/20" in rows[1]  # the step of the line before, read at the same redraw
    assert "loss=0.25" in rows[1]
    more = [s for s in screen if s.startswith("... and ")]
    assert more == [f"... and {58 - len(rows)} more running (most recently changed shown)"]
    assert any("t/seed-3" in s and "job_failed" in s and "exit 1" in s for s in screen)
    assert not any(s.startswith("t/seed-4 ") for s in screen)  # succeeded: in the header's count only


def test_follow_merges_each_jobs_progress_lines_and_takes_meter_readings_on_its_short_way() -> None:
    """What `follow` takes inline (progress lines and meter readings, most events at N=10,000) ends as
    `event()` would have it: each key of a job's lines as the last line that had it said, an ended
    job's later lines ignored, the next attempt's lines on a row cleared by its AttemptStarted."""
    t = time.time() - 10
    view = View(["t/seed-1", "t/seed-2", "u/seed-1"], json_mode=False, out=io.StringIO())
    events: collections.deque[Event] = collections.deque(_events_of_a_batch(3, t)[3:])  # seeds 1 and 2 running
    events += [
        Progress(job="t", seed=1, stage="setup", line={"stage": "setup"}, t=t + 1),
        Progress(job="t", seed=1, line={"step": 3, "loss": 0.5}, t=t + 2),
        Metered(job="t", seed=1, usd=0.2, t=t + 2),
        Progress(job="t", seed=1, line={"step": 4}, t=t + 3),
        Progress(job="t", seed=2, stage="train", line={"stage": "train", "step": 9}, t=t + 1),
        JobEnded(job="t", seed=2, outcome="failed", failure=Code.JOB_FAILED, detail="exit 1", t=t + 2),
        Progress(job="t", seed=2, stage="late", line={"stage": "late"}, t=t + 3),  # after its end: not shown
        Progress(job="nobody", seed=1, line={"step": 1}, t=t + 3),  # a job not of this view
        AttemptStarted(job="u", seed=1, attempt=0, offer=Offer(cloud="sim", gpu="H100", hourly_usd=1.0), t=t),
        Progress(job="u", seed=1, line={"step": 7, "total": 10}, t=t + 1),
        AttemptStarted(job="u", seed=1, attempt=1, offer=Offer(cloud="sim", gpu="H100", hourly_usd=1.0), t=t + 2),
        Progress(job="u", seed=1, attempt=1, line={"stage": "resume"}, t=t + 3),
    ]
    n = len(events)
    ended: list[JobEnded] = []
    view.follow(events, lambda e: isinstance(e, JobEnded) and not ended.append(e))  # one frame takes them all
    view._take_pending()
    one, two, other = view.lines["t/seed-1"], view.lines["t/seed-2"], view.lines["u/seed-1"]
    assert one.fields == {"stage": "setup", "step": 4, "loss": 0.5}
    assert one.metered == 0.2
    assert (two.state, two.fields) == ("failed", {"stage": "train", "step": 9})
    assert (other.attempt, other.fields, other.total) == (1, {"stage": "resume"}, None)
    screen = ["".join(text for text, _ in line) for line in view._screen(t + 10, 20, 200)]
    rows = {s.split()[0]: s for s in screen if s.startswith(("t/", "u/"))}
    assert " setup " in rows["t/seed-1"]
    assert "loss=0.5" in rows["t/seed-1"]
    assert " resume " in rows["u/seed-1"]
    assert "t/seed-2" not in rows  # failed: listed below the rows, its stage not shown
    assert (one.stage, one.step, other.stage, other.step) == ("setup", 4, "resume", None)  # read as drawn
    assert view.progress == 0.0  # the first attempt's 7 of 10 went with it
    assert view.statistics().events == n
    assert not events
    assert len(ended) == 1


def test_a_row_shows_the_retry_budgets_its_job_drew_on_against_their_limits() -> None:
    """Issue 43: a job's per-kind counts against their limits (as `status` says them) on its row, in the
    failed list and on a plain line; taken from Retrying and JobEnded as a field, nothing made per event."""
    t = time.time() - 10
    offer = Offer(cloud="sim", region="us-east", gpu="H100", hourly_usd=3.6)
    view = View([f"t/seed-{i}" for i in range(4)], json_mode=False, out=io.StringIO())
    for e in _events_of_a_batch(3, t):
        view.event(e)
    drew = {"failures": BudgetCount(used=0, limit=3), "preemptions": BudgetCount(used=2, limit=6),
            "stalls": BudgetCount(used=1, limit=3)}
    view.event(AttemptEnded(job="t", seed=1, outcome="failed", failure=Code.RETRIABLE, t=t + 1,
                            detail="the job flagged retriable (exited 1): NCCL error"))
    retrying = Retrying(job="t", seed=1, attempt=3, failure=Code.PREEMPTED, delay_s=0.0, offer=offer, counts=drew,
                        t=t + 2)
    view.event(retrying)
    assert view.lines["t/seed-1"].counts is drew  # a field set, no text made per event
    view.event(Retrying(job="t", seed=0, attempt=1, failure=Code.PREEMPTED, delay_s=0.0, offer=offer, t=t + 2,
                        counts={"failures": BudgetCount(used=0, limit=3)}))  # drew on nothing: no column
    view.event(JobEnded(job="t", seed=2, outcome="failed", failure=Code.PREEMPTED, detail="7 preemptions", t=t + 3,
                        counts={"failures": BudgetCount(used=1, limit=3), "preemptions": BudgetCount(used=7, limit=6)}))
    screen = ["".join(text for text, _ in line) for line in view._screen(t + 10, 20, 200)]
    heads = [s for s in screen if s.startswith("job ")]
    assert heads
    assert "retries" in heads[0]
    rows = {s.split()[0]: s for s in screen if s.startswith("t/seed-")}
    assert "preemptions 2/6, stalls 1/3" in rows["t/seed-1"]
    assert "failures" not in rows["t/seed-1"]  # a budget not drawn on is not shown
    assert "/3" not in rows["t/seed-0"].split("$")[-1]
    failed = [s for s in screen if s.startswith("  t/seed-2")]
    assert failed
    assert "[failures 1/3, preemptions 7/6]" in failed[0]
    # narrow: the column goes (after `reported`) before the progress bar, and every line fits
    narrow = ["".join(text for text, _ in line) for line in view._screen(t + 10, 20, 100)]
    assert all(len(s) <= 99 for s in narrow[1:]), narrow
    # off a terminal: the plain line of a state change says them too
    plain = io.StringIO()
    off = View(["t/seed-1"], json_mode=False, out=plain)
    off.event(AttemptStarted(job="t", seed=1, offer=offer, t=t))
    off.event(retrying)
    assert "[preemptions 2/6, stalls 1/3]" in plain.getvalue().splitlines()[-1]
    # with nothing drawn on, the frame is as before: no column, no heading
    quiet = View(["t/seed-1"], json_mode=False, out=io.StringIO())
    for e in _events_of_a_batch(2, t)[3:]:
        quiet.event(e)
    assert not any("retries" in "".join(x for x, _ in line) for line in quiet._screen(t + 10, 20, 200))
