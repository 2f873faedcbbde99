"""Issue 29 fixes at the command line: a closed pipe ends a command quietly (29.8); `logs --attempt`
of no such attempt, usage without a command, help on every argument, where state lives (29.11);
`status` and `cost` as people read them (29.9, 29.10)."""

from __future__ import annotations

import argparse
import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from cli_inproc import CLI, run_cli

from actor_run.supervisors.cli.main import _parser

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}

BATCH = """\
[job]
name = "t"
command = "sh -c 'echo hello {seed}'"
seeds = [1, 2, 3]

[policy]
poll_s = 0.1
"""


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger with one finished run of three seeds."""
    tmp = tmp_path_factory.mktemp("ran")
    (tmp / "b.toml").write_text(textwrap.dedent(BATCH))
    done = run_cli(["run", str(tmp / "b.toml"), "--state-dir", str(tmp / "state"), "--ledger",
                           str(tmp / "l.sqlite"), "--out", str(tmp / "out")], timeout=180, env=ENV)
    assert done.returncode == 0, done.stderr
    return tmp / "l.sqlite"


def cli(ledger: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--ledger", str(ledger), "--state-dir", str(ledger.parent / "state")],
                          timeout=60, env=ENV)


@pytest.mark.parametrize("args", [["runs"], ["runs", "--json"], ["status", "--json"], ["cost"], ["cost", "--json"],
                                  ["logs", "t/1"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(ledger: Path, args: list[str]) -> None:
    proc = subprocess.Popen([*CLI, *args, "--ledger", str(ledger), "--state-dir", str(ledger.parent / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None
    proc.stdout.close()  # `| head -0`: nobody reads what it writes
    _, err = proc.communicate(timeout=60)
    assert err.decode() == ""
    assert proc.returncode in (0, 141)


def test_logs_of_an_attempt_that_is_not_there_names_those_that_are(ledger: Path) -> None:
    done = cli(ledger, "logs", "t/2", "--attempt", "5")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "--attempt 5: t/seed-2 has attempt(s) 0 in run " in done.stderr
    there = cli(ledger, "logs", "t/2", "--attempt", "0")
    assert there.returncode == 0
    assert "hello 2" in there.stdout


@pytest.mark.parametrize("args", [[], ["clouds"], ["config"]])
def test_no_command_prints_the_usage(args: list[str]) -> None:
    done = run_cli([*args], timeout=60, env=ENV)
    assert done.returncode == 2
    assert done.stderr.startswith(f"usage: actor-run{' ' + args[0] if args else ''}")
    assert "required" not in done.stderr
    if not args:
        for command in ("run", "plan", "cancel", "ssh", "offers", "status", "cost"):
            assert command in done.stderr


def test_every_argument_of_every_command_has_help() -> None:
    missing = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    walk(child, f"{path} {name}")
            elif not a.help and not isinstance(a, argparse._HelpAction):
                missing.append(f"{path} {'/'.join(a.option_strings) or a.dest}")

    walk(_parser(), "actor-run")
    assert missing == []


def test_run_help_says_where_the_ledger_and_state_live() -> None:
    done = run_cli(["run", "--help"], timeout=60,
                          env={**ENV, "XDG_STATE_HOME": "/somewhere/state"})
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "<state> = /somewhere/state/actor-run" in text
    assert "the ledger is <state>/ledger.sqlite unless --ledger or $ACTOR_RUN_LEDGER" in text


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
                              timeout=180, env=ENV)
        assert done.returncode == 0, done.stderr
    rows = [line.split() for line in run_cli(["cost", *common], timeout=60, env=ENV).stdout.splitlines()]
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
                           env=ENV).stdout.splitlines()
    assert sum(line.startswith("run ") for line in every) == 2
    assert sum(line.strip().startswith("c/seed-1 ") for line in every) == 2  # once per run, not merged


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
        end = time.monotonic() + 90
        while time.monotonic() < end:  # bounded poll of what another process writes
            done = run_cli(["status", *common], timeout=60, env=ENV)
            lines = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("s/seed-")]
            # until it runs and has cost something (an in-process status can read it within a
            # tenth of a second of the lease, before a cent's hundredth has accrued)
            if any("stage train" in line and line.split()[4] != "$0.0000" for line in lines):
                break
            time.sleep(0.1)
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


def test_a_batch_run_again_keeps_each_runs_results(tmp_path: Path) -> None:
    body = '[job]\nname = "again"\ncommand = "sh -c \'echo $ACTOR_RUN_SEED-$$ > $ACTOR_RUN_OUT/r.txt\'"\nseeds = [1]\n'
    (tmp_path / "b.toml").write_text(body)
    out = tmp_path / "out"
    runs = []
    for _ in range(2):
        done = run_cli(["run", str(tmp_path / "b.toml"), "--state-dir", str(tmp_path / "state"),
                               "--out", str(out)], timeout=180, env=ENV)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.split()[1].rstrip(":"))  # "run <id>: 1 job(s), ..."
    first, second = (out / r / "again" / "seed-1" for r in runs)
    assert (first / "r.txt").exists() is False  # the job's out/ is under out/
    texts = [(d / "out" / "r.txt").read_text() for d in (first, second)]
    assert texts[0] != texts[1]  # two runs, two results, neither overwritten
    assert (out / "latest").resolve() == (out / runs[1]).resolve()
    for d, run in zip((first, second), runs, strict=True):
        log = (d / "log.txt").read_text()
        assert log.startswith(f"--- run {run} attempt 0 on local")
        assert log.count("--- run ") == 1  # this run's attempts only
