"""A newcomer's first hour (issue 46), through the CLI as a user runs it: every number and word on
the screen checked against the ledger, every command safe to mistype."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import pytest
from cli_inproc import run_cli

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def cli(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_cli([str(a) for a in args], timeout=timeout, cwd=cwd, env=env or ENV)


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- item 3: reading commands read ------------------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["runs"], ["cost"], ["report"], ["logs", "job/1"]])
def test_a_reading_command_on_a_mistyped_ledger_makes_nothing_and_says_so(tmp_path: Path,
                                                                        command: list[str]) -> None:
    before = tree(tmp_path)
    missing = tmp_path / "typo" / "ledger.sqlite"
    done = cli(*command, "--ledger", missing, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"actor-run: --ledger {missing}: no such ledger file\n")
    assert tree(tmp_path) == before  # no folder, no file
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    done = cli(*command, "--ledger", empty, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, f"actor-run: --ledger {empty} is an empty file, not a ledger\n")
    assert empty.read_bytes() == b""  # not turned into a database
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    done = cli(*command, "--ledger", text, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"actor-run: --ledger {text} is not an actor-run ledger (not an SQLite file)\n"
    assert text.read_text() == "my notes\n"
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    done = cli(*command, "--ledger", other, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"actor-run: --ledger {other} is an SQLite file but not an actor-run ledger\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite", "notes.txt", "other.sqlite"]


def test_status_before_any_run_makes_no_state_folder(tmp_path: Path) -> None:
    env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("ACTOR_RUN_LEDGER", None)
    for command in (["status"], ["runs"]):
        done = cli(*command, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert "no run in the ledger" in done.stdout
    assert not (tmp_path / "state").exists()


# --- item 1: a GPU is sold by a cloud, never claimed by this computer ------------------------------


def settings_env(tmp_path: Path, text: str | None) -> dict[str, str]:
    """ENV with the user's settings file (None: none) and a state folder under tmp_path."""
    env = {**ENV, "XDG_STATE_HOME": str(tmp_path / "state"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("ACTOR_RUN_CONFIG", None)
    env.pop("ACTOR_RUN_LEDGER", None)
    if text is not None:
        (tmp_path / "config" / "actor-run").mkdir(parents=True)
        (tmp_path / "config" / "actor-run" / "config.toml").write_text(text)
    return env


def test_a_gpu_no_configured_cloud_sells_is_exit_2_naming_the_clouds_asked(tmp_path: Path) -> None:
    env = settings_env(tmp_path, None)
    done = cli("run", "--gpu", "H100", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("actor-run: --gpu: no configured cloud sells 'H100' (your settings ")
    assert "name no [clouds.<name>]" in done.stderr
    assert not (tmp_path / "state" / "actor-run" / "local").exists()  # nothing ran on this computer
    local = cli("run", "--gpu", "H100", "--cloud", "local", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert local.returncode == 2
    assert local.stderr.startswith("actor-run: candidates[0].gpu: local has no GPU 'H100' (this computer claims none")
    env = settings_env(tmp_path / "b", "[clouds.sim]\nlaunch_latency_s = 0.01\n[clouds.local]\nmax_machines = 2\n")
    typo = cli("run", "--gpu", "H1000", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert typo.returncode == 2
    assert typo.stderr.startswith("actor-run: --gpu: no configured cloud sells 'H1000' (asked: sim, local;")
    assert "did you mean 'H100'" in typo.stderr
    walked = cli("run", "--gpu", "a100", "--print-batch", "--", "nvidia-smi", cwd=tmp_path, env=env)
    assert walked.returncode == 0, walked.stderr
    assert 'cloud = "sim"\ngpu = "a100"' in walked.stdout and 'cloud = "local"' not in walked.stdout


def test_a_one_liner_runs_on_the_configured_cloud_that_sells_the_gpu(tmp_path: Path) -> None:
    env = settings_env(tmp_path, '[clouds.sim]\nlaunch_latency_s = 0.01\ndelete_latency_s = 0.0\n'
                                 '[clouds.local]\ngpus = ["RTX4090"]\n')
    done = cli("run", "--gpu", "H100", "--json", "--", "true", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert '"cloud":"sim"' in done.stdout and '"cloud":"local"' not in done.stdout
    mine = cli("run", "--gpu", "RTX4090", "--json", "--", "true", cwd=tmp_path, env=env)
    assert mine.returncode == 0, mine.stderr
    assert '"cloud":"local"' in mine.stdout and '"cloud":"sim"' not in mine.stdout


def test_clouds_check_sim_names_every_gpu_it_sells_where(tmp_path: Path) -> None:
    env = settings_env(tmp_path, None)
    done = cli("clouds", "check", "sim", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [x for x in lines if x.startswith("  A100")] == [
        "  A100: in stock in ap-south at $1.50/h, stock 2", "  A100: in stock in us-east at $1.80/h, stock 8",
        "  A100: in stock in eu-west at $2.10/h, stock 4"]
    assert [x for x in lines if x.startswith("  H100")] == [
        "  H100: in stock in us-east at $2.90/h, stock 4", "  H100: in stock in eu-west at $3.20/h, stock 2"]
    assert "out of stock" not in done.stdout  # it sells nothing else, so says nothing else
