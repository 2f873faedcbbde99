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
