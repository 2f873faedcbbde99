"""Whole batches on your own machines over SSH, against a real OpenSSH sshd on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import psutil
from support.cli_inproc import CLI, run_cli
from support.sshd import Sshd
from support.waits import settled

JOB = r'''
import json, os, sys, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
data = open(os.path.join(os.environ["ACTOR_RUN_IN"], "data", "data.txt")).read()
steps = int(os.environ.get("STEPS", "4"))
for step in range(steps):
    time.sleep(float(os.environ.get("STEP_S", "0.2")))  # the job's own work: a step takes this long
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n"); progress.flush()
    print("step", step, flush=True)
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "result.txt"), "w").write(f"{os.environ['ACTOR_RUN_SEED']} {data}")
'''


def batch(tmp: Path, sshd: Sshd, *, seeds: list[int], slots: int = 2, steps: int = 4, step_s: float = 0.2,
          lost_after_s: float = 20) -> Path:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "job.py").write_text(JOB)
    (tmp / "data.txt").write_text("payload")
    path = tmp / "ssh.toml"
    path.write_text(f"""
[job]
name = "ssh-batch"
command = "python3 job.py"
code = "code"
inputs = {{ data = "data.txt" }}
seeds = {seeds}
timeout_s = 120
env = {{ STEPS = "{steps}", STEP_S = "{step_s}" }}
public_env = ["STEPS", "STEP_S"]

[policy]
max_attempts = 2
concurrency = {len(seeds)}
setup_grace_s = 30
stall_after_s = 30
poll_s = 0.2
lost_after_s = {lost_after_s}
""" + sshd.cloud_toml(tmp, slots=slots))
    return path


def cli(tmp: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=timeout, cwd=tmp)


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_a_batch_over_ssh_brings_outputs_back_and_sends_nothing_twice(tmp_path: Path, sshd: Sshd) -> None:
    path = batch(tmp_path, sshd, seeds=[1, 2])
    first = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
    assert first.returncode == 0, first.stderr
    for seed in (1, 2):
        assert (tmp_path / "out" / "latest" / "ssh-batch" / f"seed-{seed}" / "out" / "result.txt").read_text() == (
            f"{seed} payload")
        assert "step 3" in (tmp_path / "out" / "latest" / "ssh-batch" / f"seed-{seed}" / "log.txt").read_text()
    evs = events(first.stdout)
    # two attempts on one host at once: both started before either ended
    started = [e["t"] for e in evs if e["type"] == "JobStarted"]
    exited = [e["t"] for e in evs if e["type"] == "Exited"]
    assert len(started) == 2
    assert max(started) < min(exited)
    # a second run on the same host sends no byte of unchanged code or inputs
    second = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out2"))
    assert second.returncode == 0, second.stderr
    assert [e["bytes_sent"] for e in events(second.stdout) if e["type"] == "Uploaded"] == [0, 0]
    # nothing of ours left on the host but the shared code and objects; every slot free
    root = tmp_path / "root"
    assert not list((root / "work").glob("*")) if (root / "work").exists() else True
    assert not list((root / "slots").glob("*")) if (root / "slots").exists() else True
    status = cli(tmp_path, "status", "--json")
    machines = [d for d in map(json.loads, status.stdout.splitlines()) if d["kind"] == "machine"]
    assert {d["state"] for d in machines} == {"deleted"}


def test_a_cut_connection_mid_run_is_waited_out(tmp_path: Path, sshd: Sshd) -> None:
    path = batch(tmp_path, sshd, seeds=[1], steps=12, step_s=0.25)
    proc = subprocess.Popen([*CLI, "run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if '"type":"Progress"' in line:
            break
    sshd.restart()  # every connection drops; the listener comes back on the same port
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    evs = events(out)
    assert [e["outcome"] for e in evs if e["type"] == "JobEnded"] == ["succeeded"]
    assert [e["outcome"] for e in evs if e["type"] == "AttemptEnded"] == ["succeeded"]  # no retry needed


def test_a_killed_controller_leaves_the_watchdog_to_end_the_job(tmp_path: Path, sshd: Sshd) -> None:
    lost = 2
    path = batch(tmp_path, sshd, seeds=[1], steps=400, step_s=0.25, lost_after_s=lost)
    proc = subprocess.Popen([*CLI, "run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = None
    for line in proc.stdout:
        e = json.loads(line)
        if e["type"] == "JobStarted":
            pid = e["pid"]
        if e["type"] == "Progress":
            break
    assert pid is not None
    assert psutil.pid_exists(pid)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    killed = time.monotonic()
    work = list((tmp_path / "root" / "work").glob("*/*/*/*"))
    assert work, "the attempt's folder is on the host"
    # the watchdog gives up after lost + min(60, lost) s, checking every second; then TERM, KILL
    limit = lost + min(60, lost) + 2 * 1 + 2 + 5
    settled(lambda: psutil.pid_exists(pid) or any(w.exists() for w in work), limit - (time.monotonic() - killed),
            every=0.2)
    gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert gone, "the job still runs"
    assert not any(w.exists() for w in work), "its folder is still there"
    # the slot stays claimed until a sweep deletes the dead controller's machine
    swept = cli(tmp_path, "sweep")
    assert swept.returncode == 0, swept.stdout + swept.stderr
    assert " deleted " in swept.stdout, swept.stdout + swept.stderr
    assert not list((tmp_path / "root" / "slots").glob("*"))
