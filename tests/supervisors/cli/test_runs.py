"""Runs through the real CLI: each `actor-run run` is a run with its own id, history and output
folder; `runs` lists them, `status --run` shows one, and `resume` (from any working directory)
writes where the run said."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

from support.cli_inproc import CLI, run_cli
from support.controller_kit import kill_when, wait_no_processes, write_batch
from support.waits import poll

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.supervisors.ledger import LedgerReader

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli([*args], timeout=timeout, cwd=cwd, env=ENV)


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in text.splitlines()]


def test_two_runs_of_one_batch_keep_their_own_history(tmp_path: Path) -> None:
    batch = tmp_path / "batch.toml"
    batch.write_text('[job]\nname = "twice"\ncommand = "sh -c \'echo {seed} > $ACTOR_RUN_OUT/seed.txt\'"\n'
                     "seeds = [1, 2]\n\n[policy]\npoll_s = 0.1\n")
    common = ["--state-dir", str(tmp_path / "state")]
    runs = []
    for out in ("out1", "out2"):
        done = cli("run", str(batch), "--json", "--out", out, *common, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        first = done.stderr.splitlines()[0]
        assert first.startswith("run "), done.stderr
        assert first.endswith(f"2 job(s), results in {tmp_path / out}"), done.stderr
        run = first.split()[1].rstrip(":")
        events = lines(done.stdout)
        assert events
        assert {e["run"] for e in events} == {run}  # every --json event carries its run
        runs.append(run)
    assert len(set(runs)) == 2
    listed = lines(cli("runs", "--json", *common, cwd=tmp_path).stdout)
    assert [(r["id"], r["state"], r["succeeded"], r["failed"], r["unfinished"], r["batch"], r["out_dir"])
            for r in listed] == [(run, "succeeded", 2, 0, 0, str(batch), str(tmp_path / out))
                                 for run, out in zip(runs, ("out1", "out2"), strict=True)]
    human = cli("runs", *common, cwd=tmp_path).stdout
    assert all(run in human for run in runs)
    for run, out in zip(runs, ("out1", "out2"), strict=True):
        shown = lines(cli("status", "--run", run, "--json", *common, cwd=tmp_path).stdout)
        assert [d["id"] for d in shown if d["kind"] == "run"] == [run]
        jobs = [d for d in shown if d["kind"] == "job"]
        assert [(j["run"], j["key"], j["state"], j["out_dir"]) for j in jobs] == [
            (run, f"twice/seed-{s}", "succeeded", str(tmp_path / out / run / "twice" / f"seed-{s}")) for s in (1, 2)]
        assert (tmp_path / out / run / "twice" / "seed-2" / "out" / "seed.txt").read_text() == "2\n"
    # each run keeps its own attempt 0 of each seed: the second did not replace the first's
    reader = LedgerReader(tmp_path / "state" / "ledger.sqlite")
    try:
        assert sorted((a["run"], a["job"], a["attempt"], a["state"]) for a in reader.attempts()) == sorted(
            (run, f"twice/seed-{s}", 0, "succeeded") for run in runs for s in (1, 2))
    finally:
        reader.close()
    latest = cli("status", *common, cwd=tmp_path)
    assert f"run {runs[1]} (succeeded)" in latest.stdout, latest.stdout
    assert "no machine alive" in latest.stdout
    unknown = cli("status", "--run", "nosuchrun", *common, cwd=tmp_path)
    assert (unknown.returncode, unknown.stderr.strip()) == (
        2, "actor-run: --run: no run 'nosuchrun' in this ledger (see `actor-run runs`)")


def test_resume_from_another_folder_writes_where_the_run_said(tmp_path: Path) -> None:
    batch = write_batch(tmp_path)
    # a relative --out: the run resolves it (here, tmp_path/out) and records it at its start
    proc = subprocess.Popen([*CLI, "run", str(batch), "--json", "--out", "out", "--state-dir", str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    kill_when(proc, "JobStarted*2", random.Random(3))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    common = ["--state-dir", str(tmp_path / "state")]
    [run] = lines(cli("runs", "--json", *common, cwd=elsewhere).stdout)
    assert (run["state"], run["unfinished"], run["out_dir"]) == ("abandoned", 4, str(tmp_path / "out"))
    unknown = cli("resume", "nosuchrun", *common, cwd=elsewhere)
    assert (unknown.returncode, unknown.stderr.strip()) == (
        2, "actor-run: run: no run 'nosuchrun' in this ledger (see `actor-run runs`)")
    resume = cli("resume", run["id"], *common, cwd=elsewhere)
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert f"resuming 4 job(s) of run {run['id']}: " in resume.stdout, resume.stdout
    for seed in range(1, 5):
        seed_dir = tmp_path / "out" / "latest" / "chaos" / f"seed-{seed}"
        assert (seed_dir / "out" / "done.txt").read_text() == str(seed)
        assert json.loads((seed_dir / "response.json").read_text())["outcome"] == "succeeded"
        assert (seed_dir / "log.txt").is_file()
    assert list(elsewhere.iterdir()) == []  # nothing landed where resume was started
    [after] = lines(cli("runs", "--json", *common, cwd=elsewhere).stdout)
    assert (after["id"], after["state"], after["succeeded"]) == (run["id"], "succeeded", 4)
    assert sim_machines(tmp_path / "sim") == []
    assert wait_no_processes(tmp_path / "sim") == []


STAGED = r'''
[job]
name = "s"
command = """sh -c 'echo \"{\\\"stage\\\": \\\"train\\\"}\" >> \"$ACTOR_RUN_PROGRESS\"; \
  for i in $(seq 1 1200); do [ -e \"$GATE\" ] && exit 0; sleep 0.1; done; exit 3'"""
seeds = [1, 2]
env = { GATE = "GATE_PATH" }

[policy]
poll_s = 0.1
concurrency = 1

[[candidates]]
cloud = "sim"
gpu = "A100"
regions = ["us-east"]

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.01
'''


def test_status_shows_queued_and_running_with_place_stage_and_cost(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    (tmp_path / "b.toml").write_text(STAGED.replace("GATE_PATH", str(gate)))
    common = ["--state-dir", str(tmp_path / "state"), "--ledger", str(tmp_path / "l.sqlite")]
    proc = subprocess.Popen([*CLI, "run", str(tmp_path / "b.toml"), *common, "--out", str(tmp_path / "out")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    follow = None
    try:
        lines: list[str] = []

        def running_at_a_cost() -> bool:  # what another process writes
            nonlocal lines
            done = run_cli(["status", *common], timeout=60, env=ENV)
            lines = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("s/seed-")]
            # until it runs and has cost something (an in-process status can read it within a
            # tenth of a second of the lease, before a cent's hundredth has accrued)
            return any("stage train" in line and line.split()[4] != "$0.0000" for line in lines)

        poll(running_at_a_cost, 90, "a running job with a cost in status", every=0.1)
        first, second = sorted(lines)
        assert first.split()[:2] == ["s/seed-1", "running"], lines
        assert "on sim us-east, stage train" in first
        assert first.split()[4] != "$0.0000"  # a running machine costs by the second
        assert second.split()[:2] == ["s/seed-2", "queued"], lines
        follow = subprocess.Popen([*CLI, "status", "--follow", *common], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=ENV)
        assert follow.stdout is not None
        first_seen = [follow.stdout.readline(), follow.stdout.readline()]  # its first poll: both jobs, gate shut
        gate.touch()
        rest, _ = follow.communicate(timeout=120)
        out = "".join(first_seen) + rest
        assert proc.wait(timeout=120) == 0
    finally:
        for p in (proc, follow):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    said = [line.split()[:2] for line in out.splitlines()]
    assert ["s/seed-1", "running"] in said
    assert ["s/seed-2", "queued"] in said
    assert ["s/seed-2", "succeeded"] in said
