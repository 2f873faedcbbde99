"""Whole batches through `actor-run` against a fake provider: `cli` runs a command in this process
(tests/support/cli_inproc.py), `start_run` a real controller process (to be killed, or read as it runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from support.cli_inproc import run_cli, start_cli

from fakes.keys import client_key

JOB = r'''
import json, os, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
data = open(os.path.join(os.environ["ACTOR_RUN_IN"], "data", "data.txt")).read()
steps = int(os.environ.get("STEPS", "3"))
if os.environ.get("ACTOR_RUN_ATTEMPT") == "0":  # the first attempt may be made longer (to be cut short)
    steps = int(os.environ.get("FIRST_STEPS", steps))
for step in range(steps):
    time.sleep(float(os.environ.get("STEP_S", "0.1")))  # the job's own work: a step takes this long
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n"); progress.flush()
    print("step", step, flush=True)
    gate = os.environ.get("GATE")
    if step == 0 and gate:  # hold here until the test opens the gate (bounded: 120 s)
        for _ in range(2400):
            if os.path.exists(gate):
                break
            time.sleep(0.05)  # the job (another process) holds, bounded, until the test opens its gate
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "result.txt"), "w").write(f"{os.environ['ACTOR_RUN_SEED']} {data}")
'''


def write_batch(tmp: Path, cloud: str, url: str, *, gpus: list[str], seeds: list[int], steps: int = 3,
                first_steps: int | None = None, step_s: float = 0.1, attempts: int = 3,
                settings: dict[str, Any] | None = None, gate: Path | None = None) -> Path:
    """`gate`: each job, after its first step, waits until this file exists (so it cannot end
    before the test has done what it needs while the job runs)."""
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "job.py").write_text(JOB)
    (tmp / "data.txt").write_text("payload")
    key = client_key(tmp / "keys")
    candidates = "".join(f'\n[[candidates]]\ncloud = "{cloud}"\ngpu = "{g}"\n' for g in gpus)
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (settings or {}).items())
    path = tmp / f"{cloud}.toml"
    path.write_text(f"""
[job]
name = "rented"
command = "python3 job.py"
code = "code"
inputs = {{ data = "data.txt" }}
seeds = {seeds}
timeout_s = 120
env = {{ STEPS = "{steps}", FIRST_STEPS = "{first_steps or steps}", STEP_S = "{step_s}", GATE = "{gate or ''}" }}
public_env = ["STEPS", "FIRST_STEPS", "STEP_S", "GATE"]

[policy]
max_attempts = {attempts}
concurrency = {len(seeds)}
setup_grace_s = 30
stall_after_s = 30
poll_s = 0.2
lost_after_s = 10
backoff_s = 0.05
{candidates}
[clouds.{cloud}]
api_url = "{url}"
ssh_key = "{key}"
poll_s = 0.1
listing_lag_s = 1.0
delete_wait_s = 15
{extra}
""")
    return path


def env(key_var: str, key: str = "test-key") -> dict[str, str]:
    return {**os.environ, key_var: key}


def cli(tmp: Path, *args: str, key_var: str, key: str = "test-key", timeout: float = 120, process: bool = False
        ) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=timeout, cwd=tmp, env=env(key_var, key),
                   process=process)


def start_run(tmp: Path, batch: Path, *, key_var: str) -> subprocess.Popen[str]:
    return start_cli(["run", str(batch), "--json", "--out", str(tmp / "out"), "--state-dir", str(tmp / "state")],
                     cwd=tmp, env=env(key_var))


def read_until(proc: subprocess.Popen[str], kind: str) -> list[dict[str, Any]]:
    """Events until one of type `kind` (the controller keeps running)."""
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        seen.append(event)
        if event["type"] == kind:
            return seen
    raise AssertionError(f"the run ended before a {kind} event: {seen[-5:]}")


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
