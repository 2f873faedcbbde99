"""Issue 29 fixes at the command line: a closed pipe ends a command quietly (29.8); `logs --attempt`
of no such attempt, usage without a command, help on every argument, where state lives (29.11);
`status` and `cost` as people read them (29.9, 29.10)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actor_run.supervisors.cli.main import _parser

CLI = [sys.executable, "-m", "actor_run"]
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
    done = subprocess.run([*CLI, "run", str(tmp / "b.toml"), "--state-dir", str(tmp / "state"), "--ledger",
                           str(tmp / "l.sqlite"), "--out", str(tmp / "out")], capture_output=True, text=True,
                          timeout=180, env=ENV)
    assert done.returncode == 0, done.stderr
    return tmp / "l.sqlite"


def cli(ledger: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--ledger", str(ledger), "--state-dir", str(ledger.parent / "state")],
                          capture_output=True, text=True, timeout=60, env=ENV)


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
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, env=ENV)
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
    done = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, timeout=60,
                          env={**ENV, "XDG_STATE_HOME": "/somewhere/state"})
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "<state> = /somewhere/state/actor-run" in text
    assert "the ledger is <state>/ledger.sqlite unless --ledger or $ACTOR_RUN_LEDGER" in text
