"""A real controller (`actor-run run` as a child process) for the scenario tests that kill, resume or
share it: its batch (a job that takes a lock per seed, reports progress and writes a trace), the
events read until a moment to kill it at, and the processes it left."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .cli_inproc import CLI, run_cli
from .waits import settled

# The job: holds an exclusive lock per seed while it runs (a second copy of the same seed running
# at the same time would fail to take it and say OVERLAP), reports progress, writes its output.
JOB = r'''
import fcntl, json, os, sys, time
seed = os.environ["ACTOR_RUN_SEED"]
trace = os.environ["TRACE"]
lock = open(os.path.join(os.path.dirname(trace), f"seed-{seed}.lock"), "w")
try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    open(trace, "a").write(f"OVERLAP {seed}\n")
    sys.exit(9)
open(trace, "a").write(f"start {seed} {os.environ['ACTOR_RUN_ATTEMPT']} {time.time()}\n")
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
for step in range(int(os.environ.get("STEPS", "8"))):
    time.sleep(0.25)  # the job's own work: a step takes this long
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n")
    progress.flush()
held = time.monotonic()  # with HOLD set, the job then waits (at most 120 s) for the test's `release` file
while os.environ.get("HOLD") and not os.path.exists(os.path.join(os.path.dirname(trace), "release")) \
        and time.monotonic() - held < 120:
    time.sleep(0.05)  # the job (another process) holds, bounded, until the test's release file
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "done.txt"), "w").write(seed)
open(trace, "a").write(f"end {seed} {os.environ['ACTOR_RUN_ATTEMPT']} {time.time()}\n")
'''


def machine_rows(status_json: str) -> list[dict[str, Any]]:
    """The machine lines of `actor-run status --json` (it also prints its run and the run's jobs)."""
    return [d for d in map(json.loads, status_json.splitlines()) if d["kind"] == "machine"]


def release(tmp: Path) -> None:
    """Lets every job of a batch run with HOLD = "1" end (JOB waits for this file once its steps are done)."""
    (tmp / "trace" / "release").write_text("")


def write_batch(tmp: Path, *, seeds: int = 4, latency: float = 0.6, extra_sim: str = "", attempts: int = 4) -> Path:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "job.py").write_text(JOB)
    trace = tmp / "trace" / "trace.txt"
    trace.parent.mkdir(exist_ok=True)
    batch = tmp / "batch.toml"
    batch.write_text(f"""
[job]
name = "chaos"
command = "python3 job.py"
code = "code"
seeds = {list(range(1, seeds + 1))}
timeout_s = 120
env = {{ TRACE = "{trace}" }}
public_env = ["TRACE"]  # a resumer or a worker reads it from the ledger

[policy]
max_attempts = {attempts}
concurrency = {seeds}
setup_grace_s = 30
stall_after_s = 30
poll_s = 0.2
lost_after_s = 30
backoff_s = 0.05

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = {latency}
delete_latency_s = 0.0
state_dir = "{tmp / 'sim'}"
{extra_sim}
""")
    return batch


def cli(*args: str, tmp: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=timeout, cwd=tmp)


def start_run(batch: Path, tmp: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, "run", str(batch), "--json", "--out", str(tmp / "out"), "--state-dir",
                             str(tmp / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def kill_when(proc: subprocess.Popen[str], moment: str, rng: random.Random) -> list[dict]:
    """Read events until `moment` (an event type, seen `n` times), then kill -9 the controller."""
    kind, _, count = moment.partition("*")
    need = int(count or 1)
    seen: list[dict] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        seen.append(event)
        if event["type"] == kind:
            need -= 1
            if need == 0:
                time.sleep(rng.random() * 0.1)  # the thing under test: a kill at a random moment
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    return seen


def trace_lines(tmp: Path) -> list[str]:
    path = tmp / "trace" / "trace.txt"
    return path.read_text().splitlines() if path.exists() else []


def wait_no_processes(marker: Path, timeout: float = 20) -> list[str]:
    import psutil

    def left() -> list[str]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and str(marker) in " ".join(p.info["cmdline"] or []):
                    found.append(" ".join(p.info["cmdline"])[:120])
            except psutil.NoSuchProcess:
                continue
        return found

    return settled(left, timeout, every=0.1)


__all__ = ["JOB", "cli", "kill_when", "machine_rows", "release", "start_run", "trace_lines",
           "wait_no_processes", "write_batch"]
