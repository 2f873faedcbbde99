"""supervisors/cli/: `actor-run` (in the test's process, tests/support/cli_inproc.py; a real child where a
signal is sent to it), its state, ledger and outputs under tmp_path.
Exit codes: 0 all succeeded, 1 some job failed, 2 bad input or usage (nothing started), 130 after a
Ctrl-C whose cleanup finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from support.cli_inproc import CLI, run_cli
from support.process_kit import Output, sleeper, sleeping
from support.waits import poll

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.supervisors.ledger import LedgerReader

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


class Paths:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.ledger = tmp_path / "ledger.sqlite"
        self.out = tmp_path / "out"

    def common(self) -> list[str]:
        return ["--state-dir", str(self.state), "--ledger", str(self.ledger)]

    def run_args(self, batch: Path | str, *extra: str) -> list[str]:
        return [*CLI, "run", str(batch), *self.common(), "--out", str(self.out), *extra]

    def machine_rows(self) -> list[Any]:
        if not self.ledger.exists():
            return []
        reader = LedgerReader(self.ledger)
        try:
            return reader.machines()
        finally:
            reader.close()

    def status(self) -> list[dict[str, Any]]:
        done = run_cli(["status", "--json", *self.common()], timeout=60, env=ENV)
        assert done.returncode == 0, done.stderr
        return [d for d in map(json.loads, done.stdout.splitlines()) if d["kind"] == "machine"]


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)


def cli(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`args` a whole command line (`[*CLI, ...]`, as a Popen takes it), run in this process."""
    assert args[:len(CLI)] == CLI, args
    return run_cli(args[len(CLI):], timeout=timeout, env=ENV)


def batch(tmp_path: Path, body: str, name: str = "batch.toml") -> Path:
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "data.txt").write_text("some words\n")
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


GOOD = """\
[job]
name = "t"
command = "sh -c 'echo {seed}'"
code = "code"
inputs = { data = "data.txt" }
seeds = [1]

[policy]
poll_s = 0.1
"""


def test_run_the_example_then_status(paths: Paths) -> None:
    done = cli(paths.run_args(ROOT / "examples" / "seeds.toml"))
    assert done.returncode == 0, done.stderr
    seeds = sorted(p.name for p in (paths.out / "latest" / "seeds").iterdir())
    assert seeds == ["seed-1", "seed-2", "seed-3"]
    for n in (1, 2, 3):
        d = paths.out / "latest" / "seeds" / f"seed-{n}"
        model = json.loads((d / "out" / "model.json").read_text())
        assert model["seed"] == n
        assert f"seed {n}:" in (d / "log.txt").read_text()
        body = json.loads((d / "response.json").read_text())
        assert (body["outcome"], len(body["attempts"])) == ("succeeded", 1)
    rows = paths.status()
    assert len(rows) == 3
    assert {r["state"] for r in rows} == {"deleted"}
    assert {r["cloud"] for r in rows} == {"local"}
    assert {r["owner_alive"] for r in rows} == {False}  # that controller has exited
    human = cli([*CLI, "status", *paths.common()])
    assert human.returncode == 0
    assert "no machine alive (3 in the ledger, all deleted)" in human.stdout


def test_json_run_of_a_failing_job(paths: Paths) -> None:
    path = batch(paths.tmp, GOOD.replace("sh -c 'echo {seed}'", "sh -c 'echo nope; exit 1'").replace("[1]", "[1, 2]"))
    done = cli(paths.run_args(path, "--json"))
    assert done.returncode == 1, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]  # every line is one JSON event
    assert all("type" in e and "job" in e and "seed" in e for e in events)
    ends = [e for e in events if e["type"] == "JobEnded"]
    assert sorted(e["seed"] for e in ends) == [1, 2]
    assert {e["failure"] for e in ends} == {"job_failed"}
    assert {e["failure"] for e in events if e["type"] == "AttemptEnded"} == {"job_failed"}
    assert [e["exit_code"] for e in events if e["type"] == "Exited"] == [1, 1]
    assert {r["state"] for r in paths.status()} == {"deleted"}


def test_a_mixed_batch_exits_1_and_a_good_one_0(paths: Paths) -> None:
    cmd = "sh -c 'test $ACTOR_RUN_SEED = 2 && exit 4; echo fine'"
    mixed = batch(paths.tmp, GOOD.replace("sh -c 'echo {seed}'", cmd).replace("[1]", "[1, 2, 3]"))
    done = cli(paths.run_args(mixed))
    assert done.returncode == 1
    outcomes = {
        n: json.loads((paths.out / "latest" / "t" / f"seed-{n}" / "response.json").read_text())["outcome"]
        for n in (1, 2, 3)
    }
    assert outcomes == {1: "succeeded", 2: "failed", 3: "succeeded"}
    assert "job_failed" in done.stdout  # the summary names the failure


BAD = [
    (GOOD + "colour = 'blue'\n", "policy.colour: unknown key"),
    (GOOD.replace("[job]\n", "[job]\ncolour = 'blue'\n"), "job.colour: unknown key"),
    (GOOD + "concurrency = 'x'\n", "policy.concurrency: expected int, got str"),
    (GOOD + "concurrency = -2\n", "policy.concurrency: expected int >= 1, got -2"),
    (GOOD.replace('code = "code"', 'code = "gone"'), "job.code: no such folder"),
    (GOOD.replace('"data.txt"', '"missing.txt"'), "job.inputs.data: no such file or folder"),
    (GOOD.replace("[1]", "[]"), "job.seeds: expected a non-empty list"),
    (GOOD.replace('name = "t"', 'name = "No Good"'), "job.name: expected [a-z0-9-]"),
    (GOOD + "[[candidates]]\ncloud = 'nimbus'\n", "candidates[0].cloud: unknown cloud 'nimbus'"),
    (
        GOOD + "[clouds.sim]\nno_capacity_rate = 2.0\n[[candidates]]\ncloud = 'sim'\n",
        "clouds.sim.no_capacity_rate: expected number between 0 and 1",
    ),
    (GOOD + "[clouds.sim]\nfoo = 1\n[[candidates]]\ncloud = 'sim'\n", "clouds.sim.foo: unknown key"),
    ("[job\n", "is not valid TOML"),
]


@pytest.mark.parametrize(("body", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_input_exits_2_with_one_line_and_starts_nothing(paths: Paths, body: str, message: str) -> None:
    done = cli(paths.run_args(batch(paths.tmp, body)))
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("actor-run: ")
    assert message in lines[0]
    assert paths.machine_rows() == []
    assert not (paths.out / "latest" / "t").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["run"], "give a batch file, or a command after --"),  # bare `actor-run` prints the usage: test_main.py
        (["run", "x.toml", "--bogus"], "unrecognized arguments: --bogus"),
        (["run", "x.toml", "--concurrency", "many"], "argument --concurrency: invalid int value: 'many'"),
        (["run", "{good}", "--concurrency", "0"], "--concurrency: expected int >= 1, got 0"),
        (["run", "{tmp}/missing.toml"], "cannot read batch file"),
    ],
)
def test_usage_errors_exit_2_with_one_line(paths: Paths, args: list[str], message: str) -> None:
    good = batch(paths.tmp, GOOD)
    args = [a.format(good=good, tmp=paths.tmp) for a in args]
    extra = [*paths.common(), "--out", str(paths.out)] if args and args[0] == "run" else []
    done = cli([*CLI, *args, *extra])
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert message in lines[0]
    assert paths.machine_rows() == []


# --- Ctrl-C -----------------------------------------------------------------------------------------

SLEEPER = sleeper("61.917")


def under(path: Path) -> list[str]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if str(path) in cmd and p.info["status"] != psutil.STATUS_ZOMBIE and p.pid != os.getpid():
                found.append(cmd)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.mark.parametrize("second", ["none", "at_once", "after_the_first_is_heard"])
def test_ctrl_c_deletes_every_machine_then_exits_130(paths: Paths, second: str) -> None:
    proc = subprocess.Popen(
        paths.run_args(batch(paths.tmp, SLEEPER)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stderr is not None
    stderr = Output(proc.stderr)
    try:

        def running() -> list[Any]:
            rows = [m for m in paths.machine_rows() if m.state == "alive" and m.phase == "running"]
            return rows if len(rows) == 2 else []

        poll(running, 60, "two machines alive with their jobs running")
        sim_dir = (paths.state / "sim").resolve()
        assert len(sim_machines(sim_dir)) == 2
        proc.send_signal(signal.SIGINT)
        if second == "at_once":
            proc.send_signal(signal.SIGINT)
        elif second == "after_the_first_is_heard":
            stderr.wait_for("canceling")
            proc.send_signal(signal.SIGINT)  # while the machines are being deleted (0.5 s each)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stderr.rest()
    assert code == 130, text
    assert "canceling; deleting every machine" in text
    if second == "after_the_first_is_heard":
        assert "still deleting machines" in text
    rows = paths.status()
    assert len(rows) == 2
    assert {r["state"] for r in rows} == {"deleted"}
    assert sim_machines(sim_dir) == []
    assert sleeping("61.917", paths.tmp) == []
    assert under(paths.state) == []
    for n in (1, 2):
        body = json.loads((paths.out / "latest" / "long" / f"seed-{n}" / "response.json").read_text())
        assert (body["outcome"], body["failure"]) == ("canceled", "canceled")


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
