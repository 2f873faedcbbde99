"""supervisors/cli/batch_file.py: `actor-run run [--gpu ...] -- CMD`, a batch from flags (issue 29.1),
through the real command line."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.cli_inproc import run_cli

from actor_run.protocols.specs import load_batch

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli([*args], timeout=timeout, env=ENV, cwd=cwd)


def test_print_batch_makes_a_file_that_loads_to_the_same_batch(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    done = cli(["run", "--gpu", "H100", "--cloud", "sim", "--seeds", "1-3,7", "--env", "A=1", "--env", "B=x y",
                "--code", "code", "--timeout", "1h30m", "--region", "us-east", "--budget", "5", "--print-batch",
                "--", "python", "train.py", "--seed", "{seed}", "it's"], tmp_path)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "made.toml"
    path.write_text(done.stdout)
    batch = load_batch(path, {"sim", "local"})
    job = batch.spec.job
    assert job.name == "train"
    assert job.command == "python train.py --seed {seed} 'it'\"'\"'s'"
    assert (job.seeds, job.timeout_s, job.env) == ([1, 2, 3, 7], 5400.0, {"A": "1", "B": "x y"})
    assert job.code == str(tmp_path / "code")
    assert batch.spec.policy.budget_usd == 5.0
    assert [(c.cloud, c.gpu, c.regions) for c in batch.spec.candidates] == [("sim", "H100", ["us-east"])]


def test_flags_override_the_files_values(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.toml").write_text(textwrap.dedent("""\
        [job]
        name = "t"
        command = "echo old"
        code = "../code"
        seeds = [1]
        timeout_s = 60
        env = { KEEP = "1", OVER = "a" }

        [policy]
        max_attempts = 2

        [[candidates]]
        cloud = "sim"
        gpu = "A100"
        regions = ["eu-west"]
        """))
    done = cli(["run", "sub/b.toml", "--gpu", "H100", "--seeds", "4-5", "--env", "OVER=b", "--timeout", "90s",
                "--print-batch", "--", "echo new {seed}"], tmp_path)
    assert done.returncode == 0, done.stderr
    made = tmp_path / "elsewhere.toml"  # the printed file works from another folder: its paths are absolute
    made.write_text(done.stdout)
    batch = load_batch(made, {"sim", "local"})
    job = batch.spec.job
    assert (job.name, job.command, job.seeds, job.timeout_s) == ("t", "echo new {seed}", [4, 5], 90.0)
    assert job.env == {"KEEP": "1", "OVER": "b"}
    assert job.code == str(tmp_path / "code")
    assert batch.spec.policy.max_attempts == 2
    assert [(c.cloud, c.gpu, c.regions) for c in batch.spec.candidates] == [("sim", "H100", ["eu-west"])]


def test_a_one_line_run_runs_each_seed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = cli(["run", "--state-dir", str(tmp_path / "state"), "--ledger", str(tmp_path / "l.sqlite"),
                "--out", str(out), "--seeds", "1-2", "--name", "echo",
                "--", "sh", "-c", 'echo "seed {seed}" > "$ACTOR_RUN_OUT/s.txt"'], tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr + done.stdout
    found = {p.read_text().strip() for p in out.rglob("s.txt")}
    assert found == {"seed 1", "seed 2"}
    runs = cli(["runs", "--ledger", str(tmp_path / "l.sqlite"), "--state-dir", str(tmp_path / "state")], tmp_path)
    assert "-- sh -c" in runs.stdout  # the run is named by its command line


@pytest.mark.parametrize(("args", "field"), [
    (["--seeds", "3-1"], "--seeds"), (["--seeds", "x"], "--seeds"), (["--timeout", "2 weeks"], "--timeout"),
    (["--env", "NOEQUALS"], "--env"), (["--name", "Bad Name"], "job.name"), (["--cloud", "nimbus"], "cloud"),
])
def test_bad_flags_are_one_line_naming_the_flag(tmp_path: Path, args: list[str], field: str) -> None:
    done = cli(["run", "--state-dir", str(tmp_path / "state"), *args, "--print-batch", "--", "echo hi"], tmp_path)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert field in done.stderr


def test_run_without_a_batch_or_a_command_says_what_to_give(tmp_path: Path) -> None:
    done = cli(["run", "--state-dir", str(tmp_path / "state")], tmp_path)
    assert done.returncode == 2
    assert "-- CMD" in done.stderr or "command after --" in done.stderr
    done = cli(["runs", "--state-dir", str(tmp_path / "state"), "--", "x"], tmp_path)
    assert done.returncode == 2


def test_every_command_loads_its_batch_through_batch_file() -> None:
    """One home for loading a batch: no other module of the command line reads a batch file itself."""
    import re

    cli = Path(__file__).resolve().parents[3] / "supervisors" / "cli"
    readers = re.compile(r"\b(load_batch|read_batch_table|batch_from_table|Batch\.load)\(")
    found = sorted(p.name for p in cli.glob("*.py") if readers.search(p.read_text()))
    assert found == ["batch_file.py"]
