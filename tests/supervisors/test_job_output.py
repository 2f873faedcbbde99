"""A job's output, whole or with its head and tail, in bounded memory (issue 48.3 and 48.4), through
`actor-run run` and `actor-run logs` on `local` and on the `ssh` cloud (a real sshd on loopback):

- an 8 MB log followed by a traceback and `exit 3` keeps the traceback, in log.txt and in `logs`;
- a log longer than `log_max_mb` keeps its head and its tail, with one line where the middle was cut
  naming where the whole log was;
- 200 MB of progress lines keep the controller's peak RSS under the bound the README names
  (psutil on the controller's process, sampled until it exits)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.cli_inproc import run_cli, start_cli

# the bound README.md names (its paragraph "A job's output", under "The batch file")
RSS_BOUND_MB = 400

LOUD = r"""
import os, sys, traceback
mb = int(os.environ["MB"])
line = "%07d " + "x" * 91 + "\n"  # 100 bytes a line, numbered
out = sys.stdout
for i in range(mb * 10_000):
    out.write(line % i)
out.flush()
try:
    raise RuntimeError("the last words of the job")
except RuntimeError:
    traceback.print_exc()
sys.exit(3)
"""

FLOOD = r"""
import os
mb = int(os.environ["MB"])
pad = "p" * 60
with open(os.environ["ACTOR_RUN_PROGRESS"], "a") as f:
    for i in range(mb * 10_000):  # about 100 bytes a line
        f.write('{"stage": "train", "step": %9d, "pad": "%s"}\n' % (i, pad))
print("flooded", flush=True)
"""


@pytest.fixture(params=["local", "ssh"])
def cloud_toml(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "ssh":
        yield request.getfixturevalue("sshd").cloud_toml(tmp_path)
    else:
        yield ""


def batch(tmp: Path, cloud_toml: str, script: str, *, mb: int, log_max_mb: float | None = None) -> Path:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "job.py").write_text(script)
    path = tmp / "b.toml"
    path.write_text(f"""
[job]
name = "out"
command = "python3 job.py"
code = "code"
seeds = [1]
timeout_s = 600
env = {{ MB = "{mb}" }}

[policy]
max_attempts = 1
poll_s = 0.2
""" + (f"log_max_mb = {log_max_mb}\n" if log_max_mb is not None else "") + cloud_toml)
    return path


def cli(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=300, cwd=tmp)


def test_a_long_log_keeps_its_traceback(tmp_path: Path, cloud_toml: str) -> None:
    path = batch(tmp_path, cloud_toml, LOUD, mb=8)
    done = cli(tmp_path, "run", str(path), "--out", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    log = (tmp_path / "out" / "latest" / "out" / "seed-1" / "log.txt").read_text()
    assert "RuntimeError: the last words of the job" in log
    assert "0079999 " in log  # the whole 8 MB is there: under the default log_max_mb, nothing is cut
    assert "bytes of this log were cut" not in log
    shown = cli(tmp_path, "logs", "out")
    assert shown.returncode == 0, shown.stderr
    assert "RuntimeError: the last words of the job" in shown.stdout


def test_a_log_past_its_cap_keeps_head_and_tail_with_a_mark(tmp_path: Path, cloud_toml: str) -> None:
    path = batch(tmp_path, cloud_toml, LOUD, mb=8, log_max_mb=2)
    done = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    log = (tmp_path / "out" / "latest" / "out" / "seed-1" / "log.txt").read_text()
    assert len(log) < 2_100_000, len(log)
    assert "0000000 " in log  # the head
    assert "RuntimeError: the last words of the job" in log  # the tail, the last lines always
    marks = [line for line in log.splitlines() if line.startswith("[actor-run] ")]
    assert len(marks) == 1, marks
    cut = int(re.search(r"\] (\d+) bytes of this log were cut", marks[0]).group(1))  # type: ignore[union-attr]
    assert 5_500_000 < cut < 6_500_000, marks
    assert "/log.txt, which is deleted with the machine" in marks[0]
    # the tail starts at a line's start: every line after the mark is whole
    tail = log.split(marks[0], 1)[1].splitlines()
    numbered = [line for line in tail if line[:1].isdigit()]
    assert numbered
    assert all(re.fullmatch(r"\d{7} x{91}", line) for line in numbered), numbered[:2]
    exited = [json.loads(x) for x in done.stdout.splitlines() if '"type":"Exited"' in x]
    assert [e["log_cut"] for e in exited] == [cut]
    shown = cli(tmp_path, "logs", "out")
    assert marks[0] in shown.stdout
    assert "RuntimeError: the last words of the job" in shown.stdout


def test_a_flood_of_progress_lines_keeps_the_controller_small(tmp_path: Path, cloud_toml: str) -> None:
    path = batch(tmp_path, cloud_toml, FLOOD, mb=200)
    events = tmp_path / "events.jsonl"
    with events.open("w") as sink:
        proc = start_cli(["run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                          str(tmp_path / "state")], cwd=tmp_path, stdout=sink, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak = 0
    end = time.monotonic() + 600
    try:
        while time.monotonic() < end:
            try:
                peak = max(peak, ps.memory_info().rss)
                proc.wait(timeout=0.05)  # sampled until the controller exits
                break
            except psutil.NoSuchProcess:
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert peak < RSS_BOUND_MB * 1e6, f"the controller peaked at {peak / 1e6:.0f} MB"
    exited = [json.loads(x) for x in events.read_text().splitlines() if '"type":"Exited"' in x]
    assert len(exited) == 1
    assert exited[0]["progress_dropped"] > 0  # what was not held is counted
