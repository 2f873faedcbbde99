"""`actor-run cost` (supervisors/cli/cost.py) against the sim provider's own bill: a batch with
failed launches, machines that never answer, preemptions, and a `kill -9` of the controller
followed by `actor-run resume`; the report's total equals the bill to the cent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import CLI, run_cli

from actor_run.protocols.clouds.sim import billing, preempt_machine, sim_machines

JOB = r'''
import json, os, time
progress = open(os.environ["ACTOR_RUN_PROGRESS"], "a")
for _ in range(2400):  # hold until the test opens the gate (bounded: 120 s)
    if os.path.exists(os.environ["GATE"]):
        break
    time.sleep(0.05)  # the job (another process) holds, bounded, until the test opens its gate
for step in range(8):
    time.sleep(0.25)  # the job's own work: a step takes this long
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
env = {{ GATE = "{tmp / 'gate'}" }}
public_env = ["GATE"]  # a resume reads the job's env back from the ledger

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
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=180, cwd=tmp)


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
    # the started jobs wait at the gate, so their machines could go only by a preemption (the
    # sim's own, at random); one more while no controller watches, so the bill surely has one
    left = sim_machines(tmp_path / "sim")
    if left:
        assert preempt_machine(tmp_path / "sim", left[0])
    (tmp_path / "gate").touch()
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
    spent = total["spent_usd"]
    assert (f"${spent:.4f}" if spent < 1 else f"${spent:,.2f}") in text.stdout


def test_cost_of_an_unknown_run_or_grouping_is_one_line_and_exit_2(tmp_path: Path) -> None:
    r = cli("cost", "nope", tmp=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "actor-run: RUN: no run 'nope' in this ledger (see `actor-run runs`)"
    r = cli("cost", "--all", "--by", "seed", tmp=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == ("actor-run: --by: expected one of job, cloud, gpu, account, budget, run, user, "
                                "got 'seed'")


def test_groups_failures_and_unconfirmed_deletions(tmp_path: Path) -> None:
    from actor_run.protocols.messages import Machine
    from actor_run.supervisors.cli.cost import cost_rows, render
    from actor_run.supervisors.ledger import MachineRow

    def res(job: str, attempt: int, *, account: str, gpu: str, usd: float, charged: float | None, outcome: str,
            seconds: float = 0.0, at_least: int = 0) -> dict[str, object]:
        return {"run": "r1", "job": job, "attempt": attempt, "cloud": "sim", "account": account, "gpu": gpu,
                "usd": usd, "state": "live" if charged is None else "released", "charged": charged,
                "seconds": seconds, "outcome": outcome, "at_least": at_least}

    rows = [
        res("t/seed-1", 0, account="", gpu="A100", usd=3.0, charged=0.5, outcome="failed", seconds=1000),
        res("t/seed-1", 1, account="", gpu="A100", usd=3.0, charged=1.5, outcome="succeeded", seconds=3000),
        res("t/seed-2", 0, account="team-b", gpu="H100", usd=6.0, charged=2.0, outcome="failed", seconds=720,
            at_least=1),
        res("t/seed-3", 0, account="team-b", gpu="H100", usd=6.0, charged=None, outcome=""),
        {**res("t/seed-4", 0, account="", gpu="A100", usd=9.0, charged=9.0, outcome="succeeded"), "run": "r2"},
    ]
    made = Machine(cloud="sim", id="x", name="ar-t-2-a0-aaaaaaaa-d100", hourly_usd=36.0, created_at=0.0,
                   deadline=200.0)
    stuck = MachineRow(name=made.name, cloud="sim@team-b", owner="o", job="t", seed=2, attempt=0, deadline=200.0,
                       state="alive", phase="delete_failed", machine_id="x", region="r", hourly_usd=36.0, created=0.0,
                       gone=None, reason=None, detail="refused", work=None, pid=None, launched_at=None, resumable=0,
                       machine=json.dumps({"cloud": "sim", "id": "x", "name": made.name, "hourly_usd": 36.0,
                                           "created_at": 0.0, "deadline": 200.0}), run="r1")
    by_account, total, at_least = cost_rows(rows, [stuck], run="r1", by="account")
    assert [(g.group, g.attempts, g.spent_usd, g.reserved_usd, g.held_usd, g.failed_usd, g.at_least)
            for g in by_account] == [("sim/main", 2, 2.0, 6.0, 0.0, 0.5, False),
                                     ("sim/team-b", 2, 2.0, 12.0, 6.0, 2.0, True)]
    assert (total.spent_usd, total.failed_usd, total.failed_attempts, total.machine_hours) == (4.0, 2.5, 2, 1.311111)
    assert [(a.job, a.usd) for a in at_least] == [("t/seed-2", 2.0)]  # 200 s at $36 an hour, to its deadline
    by_gpu, _, _ = cost_rows(rows, [], run=None, by="gpu")
    # every run: grouped by run (issue 29.10), a group of one run never merged with another's
    assert [(g.run, g.group, g.spent_usd) for g in by_gpu] == [("r1", "A100", 2.0), ("r1", "H100", 2.0),
                                                               ("r2", "A100", 9.0)]
    text = render(by_account, total, at_least, "account")
    assert ">=$2.00" in text  # the unconfirmed deletion's group is "at least"
    assert "at least $2.00: ar-t-2-a0-aaaaaaaa-d100 on sim@team-b" in text


PLAIN_ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


SIM = """\
[job]
name = "c"
command = "sleep 0.5"
seeds = [1, 2]

[policy]
poll_s = 0.1

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.01
"""


def test_cost_shows_cents_fractions_and_groups_every_run_by_run(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(SIM)
    common = ["--state-dir", str(tmp_path / "state"), "--ledger", str(tmp_path / "l.sqlite")]
    for _ in range(2):  # two runs of the same jobs
        done = run_cli(["run", str(tmp_path / "b.toml"), *common, "--out", str(tmp_path / "out")],
                              timeout=180, env=PLAIN_ENV)
        assert done.returncode == 0, done.stderr
    rows = [line.split() for line in run_cli(["cost", *common], timeout=60, env=PLAIN_ENV).stdout.splitlines()]
    header = rows[1]
    assert "reserved" not in header  # a finished run holds no money: no reservation columns
    assert "held" not in header
    spent = {r[0]: r[3] for r in rows[2:]}
    assert set(spent) == {"c/seed-1", "c/seed-2", "total"}
    for value in spent.values():  # seconds of an A100 at $1.80/h: a fraction of a cent, to 4 places
        assert value.startswith("$0.")
        assert len(value.split(".")[1]) == 4
        assert value != "$0.0000"
    every = run_cli(["cost", "--all", *common], timeout=60,
                           env=PLAIN_ENV).stdout.splitlines()
    assert sum(line.startswith("run ") for line in every) == 2
    assert sum(line.strip().startswith("c/seed-1 ") for line in every) == 2  # once per run, not merged
