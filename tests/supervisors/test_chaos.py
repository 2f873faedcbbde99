"""Kill the controller (`kill -9` of a real `actor-run run`) and prove nothing is lost or leaked:
`actor-run resume` finishes every job exactly once and `actor-run sweep` leaves no machine."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cli_inproc import CLI, run_cli

from actor_run.protocols.clouds.sim import billed_seconds, set_fail_deletes, sim_machines
from actor_run.supervisors.ledger import LedgerReader

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
    time.sleep(0.25)
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n")
    progress.flush()
held = time.monotonic()  # with HOLD set, the job then waits (at most 120 s) for the test's `release` file
while os.environ.get("HOLD") and not os.path.exists(os.path.join(os.path.dirname(trace), "release")) \
        and time.monotonic() - held < 120:
    time.sleep(0.05)
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
                time.sleep(rng.random() * 0.1)
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

    end = time.monotonic() + timeout
    while True:
        left = []
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if p.info["status"] != psutil.STATUS_ZOMBIE and str(marker) in " ".join(p.info["cmdline"] or []):
                    left.append(" ".join(p.info["cmdline"])[:120])
            except psutil.NoSuchProcess:
                continue
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> float:
    """Billed machine-seconds of the same batch run without interruption."""
    tmp = tmp_path_factory.mktemp("baseline")
    batch = write_batch(tmp)
    run = cli("run", str(batch), "--out", str(tmp / "out"), tmp=tmp)
    assert run.returncode == 0, run.stderr
    return billed_seconds(tmp / "sim")


# kill moments: inside a create call (intent written, no answer yet), mid-upload/start, mid-run, late
MOMENTS = ["LeaseRequested", "Leased*2", "JobStarted*3", "Progress*12", "Exited"]


@pytest.mark.parametrize("moment", MOMENTS)
def test_kill_then_resume_finishes_every_job_once(tmp_path: Path, baseline: float, moment: str) -> None:
    rng = random.Random(hash(moment) & 0xFFFF)
    batch = write_batch(tmp_path)
    proc = start_run(batch, tmp_path)
    kill_when(proc, moment, rng)
    killed_at = time.time()
    resume = cli("resume", "--out", str(tmp_path / "out"), tmp=tmp_path)
    resume_delay = time.time() - killed_at
    assert resume.returncode == 0, resume.stdout + resume.stderr
    for seed in range(1, 5):
        response = json.loads((tmp_path / "out" / "latest" / "chaos" / f"seed-{seed}" / "response.json").read_text())
        assert response["outcome"] == "succeeded"
        assert (tmp_path / "out" / "latest" / "chaos" / f"seed-{seed}" / "out" / "done.txt").read_text() == str(seed)
    lines = trace_lines(tmp_path)
    assert not [ln for ln in lines if ln.startswith("OVERLAP")], lines
    ends = [ln.split()[1] for ln in lines if ln.startswith("end")]
    assert sorted(set(ends)) == ["1", "2", "3", "4"]
    assert sim_machines(tmp_path / "sim") == []
    status = cli("status", "--json", tmp=tmp_path)
    rows = machine_rows(status.stdout)
    assert rows
    assert all(r["state"] == "deleted" for r in rows)
    assert wait_no_processes(tmp_path / "sim") == []
    # machines that outlived the controller cost at most the resume delay each
    excess = billed_seconds(tmp_path / "sim") - baseline
    assert excess <= 4 * (resume_delay + 1.5), (excess, resume_delay)


def test_kill_then_sweep_leaves_no_machine(tmp_path: Path) -> None:
    batch = write_batch(tmp_path)
    proc = start_run(batch, tmp_path)
    kill_when(proc, "JobStarted*2", random.Random(1))
    assert sim_machines(tmp_path / "sim"), "the killed controller left machines (as a real cloud would)"
    dry = cli("sweep", "--dry-run", tmp=tmp_path)
    assert "would delete" in dry.stdout
    assert sim_machines(tmp_path / "sim"), "--dry-run deleted something"
    swept = cli("sweep", tmp=tmp_path)
    assert swept.returncode == 0, swept.stderr
    assert sim_machines(tmp_path / "sim") == []
    deleted = [ln for ln in swept.stdout.splitlines() if " deleted " in ln]
    assert deleted, swept.stdout
    assert all("its owner is gone" in ln for ln in deleted), swept.stdout
    assert wait_no_processes(tmp_path / "sim") == []
    reader = LedgerReader(tmp_path / "state" / "ledger.sqlite")
    try:
        assert all(m.state == "deleted" for m in reader.machines())
    finally:
        reader.close()


def test_two_controllers_sweep_never_takes_the_others_live_machines(tmp_path: Path) -> None:
    batch = write_batch(tmp_path, latency=0.3, attempts=1)
    proc = start_run(batch, tmp_path)
    sweeps = []
    try:
        while proc.poll() is None and len(sweeps) < 40:
            sweeps.append(cli("sweep", "--json", tmp=tmp_path))
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    ended = [json.loads(x) for x in out.splitlines() if '"JobEnded"' in x]
    assert len(ended) == 4
    assert all(e["outcome"] == "succeeded" for e in ended)
    assert len(sweeps) >= 2
    for s in sweeps:
        for line in s.stdout.splitlines():
            assert json.loads(line)["action"] in ("keep", "closed"), line
    reader = LedgerReader(tmp_path / "state" / "ledger.sqlite")
    try:
        reasons = [m.reason or "" for m in reader.machines()]
        assert reasons
        assert not [r for r in reasons if r.startswith("swept")], reasons
        assert "deleted" in reasons
    finally:
        reader.close()


def test_a_delete_that_keeps_failing_stays_open_until_a_sweep(tmp_path: Path) -> None:
    batch = write_batch(tmp_path, seeds=1, latency=0.05)
    (tmp_path / "sim").mkdir()
    set_fail_deletes(tmp_path / "sim", True)
    run = cli("run", str(batch), "--out", str(tmp_path / "out"), tmp=tmp_path)
    assert run.returncode == 4  # the job succeeded; its machine's deletion is unconfirmed (not "failed")
    assert "actor-run: unconfirmed: machine " in run.stderr
    held = sim_machines(tmp_path / "sim")
    assert len(held) == 1
    assert held[0] in run.stderr
    assert "by hand" in run.stderr
    status = cli("status", "--json", tmp=tmp_path)
    rows = machine_rows(status.stdout)
    assert [r["state"] for r in rows] == ["alive"]
    assert rows[0]["phase"] == "delete_failed"
    still = cli("sweep", tmp=tmp_path)
    assert still.returncode == 1
    assert sim_machines(tmp_path / "sim") == held
    set_fail_deletes(tmp_path / "sim", False)
    swept = cli("sweep", tmp=tmp_path)
    assert swept.returncode == 0, swept.stderr
    assert sim_machines(tmp_path / "sim") == []
    status = cli("status", "--json", tmp=tmp_path)
    assert [r["state"] for r in machine_rows(status.stdout)] == ["deleted"]
    assert wait_no_processes(tmp_path / "sim") == []
    _ = os
