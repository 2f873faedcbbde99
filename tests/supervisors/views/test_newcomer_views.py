"""What a newcomer sees of a run (issue 46 item 5): a successful sim run says no WARNING (its
capacity walk and retried launches are INFO, in the run's log), and the summary on a narrow
terminal drops columns before it cuts a job's name."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from test_live_fit import ANSI, run_on_a_terminal

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_a_successful_sim_run_prints_no_warning_and_logs_its_walk_at_info(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    env = {**os.environ, "NO_COLOR": "1", "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "actor_run", "run", "examples/sim.toml"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stdout + done.stderr
    logs = list((tmp_path / "state").rglob("controller.log"))
    assert len(logs) == 1
    log = logs[0].read_text()
    assert " WARNING " not in log
    walked = re.findall(r" (\w+) +sim-seeds/seed-\d a\d+ lease failed: ", log)  # the example's 0.3 no-capacity rate
    assert set(walked) <= {"INFO"}


def test_the_summary_at_60_columns_keeps_every_job_name_whole(tmp_path: Path) -> None:
    batch = ('[job]\nname = "a-rather-long-job-name"\ncommand = "true"\nseeds = [1, 2, 3]\n'
             '[policy]\npoll_s = 0.1\n[[candidates]]\ncloud = "sim"\ngpu = "A100"\n'
             '[clouds.sim]\nlaunch_latency_s = 0.01\ndelete_latency_s = 0.0\n')
    code, text = run_on_a_terminal(tmp_path, 40, 60, batch=batch)
    assert code == 0, text[-3000:]
    plain = ANSI.sub("", text).replace("\r", "")
    table = plain[plain.rindex("summary"):]
    rows = [line for line in table.splitlines() if "a-rather-long-job-name/seed-" in line]
    assert [re.search(r"a-rather-long-job-name/seed-\d", r).group(0) for r in rows] == [  # type: ignore[union-attr]
        f"a-rather-long-job-name/seed-{s}" for s in (1, 2, 3)]
    assert all(len(line) <= 60 for line in table.splitlines())
    assert all("succeeded" in r and "$0.0" in r for r in rows)  # state and cost stay
    assert "elapsed" not in table.splitlines()[1]  # what went first


PROGRESS = '''
import json, os, sys, time
seed = int(sys.argv[1])
steps = 120 if seed == 1 else 9
with open(os.environ["ACTOR_RUN_PROGRESS"], "a") as f:
    for s in range(1, steps + 1):
        f.write(json.dumps({"stage": "train", "step": s, "total": 120}) + "\\n")
        f.flush()
if seed != 1:
    time.sleep(4)
'''


def test_the_time_left_is_not_guessed_from_a_fast_job_while_a_slow_one_has_barely_begun(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "p.py").write_text(PROGRESS)
    batch = ('[job]\nname = "eta"\ncommand = "python3 p.py {seed}"\ncode = "code"\nseeds = [1, 2]\n'
             '[policy]\npoll_s = 0.1\n')
    code, text = run_on_a_terminal(tmp_path, 40, 200, batch=batch)
    assert code == 0, text[-3000:]
    frames = [ANSI.sub("", f) for f in re.split(r"\x1b\[\?25l", text)]
    slow = [f for f in frames if re.search(r"eta/seed-2 .* 9/120", f) and "1/2 done" in f]
    assert slow, text[-3000:]  # frames while seed 1 is done and seed 2 is at step 9 of 120
    lefts = {re.search(r"left ~(\S+)", f).group(1) for f in slow}  # type: ignore[union-attr]
    assert lefts == {"-"}, lefts
