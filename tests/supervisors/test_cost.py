"""`actor-run cost` (supervisors/cmd_cost.py) against the sim provider's own bill: a batch with
failed launches, machines that never answer, preemptions, and a `kill -9` of the controller
followed by `actor-run resume`; the report's total equals the bill to the cent."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from actor_run.protocols.clouds.sim import billing, sim_machines

CLI = [sys.executable, "-m", "actor_run"]

JOB = r'''
import json, os, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
for step in range(8):
    time.sleep(0.25)
    progress.write(json.dumps({"stage": "train", "step": step}) + "\n")
    progress.flush()
open(os.path.join(os.environ["ACTOR_RUN_OUT"], "done.txt"), "w").write(os.environ["ACTOR_RUN_SEED"])
'''


def write_batch(tmp: Path) -> Path:
    (tmp / "code").mkdir()
    (tmp / "code" / "job.py").write_text(JOB)
    batch = tmp / "batch.toml"
    batch.write_text(f"""
[job]
name = "bill"
command = "python3 job.py"
code = "code"
seeds = [1, 2, 3, 4, 5, 6]
timeout_s = 120

[policy]
max_attempts = 8
concurrency = 6
budget_usd = 4000.0
setup_grace_s = 30
stall_after_s = 30
poll_s = 0.2
lost_after_s = 30
backoff_s = 0.05
backoff_max_s = 0.2
thrash_max = 40

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.3
delete_latency_s = 0.0
state_dir = "{tmp / 'sim'}"
launch_failure_rate = 0.15
boot_failure_rate = 0.15
preempt_rate = 0.4
preempt_within_s = 1.5
regions = [{{ name = "us-east", gpus = {{ A100 = {{ stock = 40, hourly_usd = 360.0 }} }} }}]
""")
    return batch


def cli(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--state-dir", str(tmp / "state")], capture_output=True, text=True,
                          timeout=180, cwd=tmp)


def test_the_cost_report_equals_the_providers_bill_to_the_cent(tmp_path: Path) -> None:
    batch = write_batch(tmp_path)
    proc = subprocess.Popen([*CLI, "run", str(batch), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                             str(tmp_path / "state")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    assert proc.stdout is not None
    started = 0
    for line in proc.stdout:  # kill -9 once three jobs run: their machines outlive the controller
        if json.loads(line)["type"] == "JobStarted":
            started += 1
            if started == 3:
                break
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert proc.stderr is not None
    proc.stderr.close()
    resume = cli("resume", "--out", str(tmp_path / "out"), tmp=tmp_path)
    assert resume.returncode in (0, 1), resume.stdout + resume.stderr
    assert sim_machines(tmp_path / "sim") == []

    report = cli("cost", "--json", "--by", "job", tmp=tmp_path)
    assert report.returncode == 0, report.stderr
    rows = [json.loads(x) for x in report.stdout.splitlines()]
    total = next(r for r in rows if r["group"] == "total")
    bill = billing(tmp_path / "sim")
    assert abs(total["spent_usd"] - sum(b.usd for b in bill)) < 0.005
    assert abs(total["machine_hours"] * 3600 - sum(b.seconds for b in bill)) < 0.05
    # the batch had what the reconciliation is about: retries, preemptions, failures that cost money
    assert total["attempts"] > 6
    assert any(b.preempted for b in bill)
    assert total["failed_usd"] > 0
    assert total["held_usd"] == 0  # nothing is still reserved: every attempt was charged
    assert not total["at_least"]
    seeds = [r for r in rows if r["group"].startswith("bill/seed-")]
    assert sum(r["spent_usd"] for r in seeds) == pytest.approx(total["spent_usd"], abs=1e-5)
    runs = [json.loads(x) for x in cli("runs", "--json", tmp=tmp_path).stdout.splitlines()]
    assert len(runs) == 1  # the resume finished the run the killed controller started
    text = cli("cost", runs[0]["id"], "--by", "gpu", tmp=tmp_path)
    assert text.returncode == 0
    assert "A100" in text.stdout
    assert f"${total['spent_usd']:,.2f}" in text.stdout


def test_cost_of_an_unknown_run_or_grouping_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = cli("cost", "nope", tmp=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "actor-run: RUN: no run 'nope' in this ledger (see `actor-run runs`)"
    r = cli("cost", "--all", "--by", "seed", tmp=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "actor-run: --by: expected one of job, cloud, gpu, account, got 'seed'"
