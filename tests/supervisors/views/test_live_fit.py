"""supervisors/views/live.py on terminals of every size (issue 29.6), through `actor-run run` on a
pseudo-terminal: one that reports 0 x 0 (the view falls back to $COLUMNS, then 80), 100 and 200
columns. Each frame fits the width with the money, budget, elapsed and time left in its header;
nothing is written between two frames (a WARNING line there left a stale header on the screen):
warnings fold into the frame, and are told once each, with their jobs, after the batch."""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path

import pytest
from support.terminal import Terminal

CLI = [sys.executable, "-m", "actor_run"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FRAME = re.compile(r"\r(?:\x1b\[(\d+)A)?\x1b\[\?25l")

BATCH = r'''
[job]
name = "fit"
command = """sh -c 'for s in 1 2 3 4 5 6; do \
  echo {\\\"stage\\\": \\\"train\\\", \\\"step\\\": $s, \\\"total\\\": 6} >> $ACTOR_RUN_PROGRESS; sleep 0.2; done'"""
seeds = [1, 2, 3, 4, 5, 6]

[policy]
concurrency = 3
poll_s = 0.1
max_attempts = 6
backoff_s = 0.05
budget_usd = 40.0

[[candidates]]
cloud = "sim"
gpu = "H100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.01
launch_failure_rate = 0.6
'''


def run_on_a_terminal(tmp: Path, rows: int, cols: int, batch: str = BATCH) -> tuple[int, str]:
    (tmp / "b.toml").write_text(batch)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update({"TERM": "xterm-256color", "NO_COLOR": "1"})
    with Terminal([*CLI, "run", str(tmp / "b.toml"), "--state-dir", str(tmp / "state"), "--out", str(tmp / "out"),
                   "--yes"], env=env, rows=rows, cols=cols) as term:
        code = term.wait(240)
    return code, term.text()

@pytest.mark.parametrize(("rows", "cols", "width"), [(0, 0, 80), (40, 100, 100), (40, 200, 200)])
def test_frames_fit_the_terminal_and_nothing_comes_between_them(tmp_path: Path, rows: int, cols: int,
                                                                width: int) -> None:
    code, text = run_on_a_terminal(tmp_path, rows, cols)
    assert code in (0, 1), text[-2000:]
    starts = list(FRAME.finditer(text))
    assert len(starts) >= 2, text[-2000:]
    for before, frame in itertools.pairwise(starts):
        drawn = text[before.end():frame.start()]
        # the next frame goes back up exactly the lines this one wrote: nothing else came between
        assert int(frame.group(1) or 0) == drawn.count("\n"), drawn
        lines = [ANSI.sub("", line).replace("\r", "") for line in drawn.split("\n")[:-1]]  # the pty writes \r\n
        header = lines[0]
        assert header.strip(), "a blank header: the width was taken as 0"
        for part in ("done", "spent", "budget $40.00", "elapsed", "left ~"):
            assert part in header, header
        for line in lines:
            assert len(line) <= width - 1, line
            assert "WARNING" not in line
    after = text[starts[-1].end():]
    folded = re.findall(r"warnings: (\d+) \(\d+ kinds?\); latest: (fit/seed-\d+): ", ANSI.sub("", text))
    if folded:  # a launch failed (6 seeds at a rate of 0.6: all but always): each kind told once, after
        assert "WARNING x" in after
        assert "(jobs fit/seed-" in after
