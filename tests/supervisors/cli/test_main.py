"""supervisors/cli/main.py: the parser as people meet it: `--version` and `python -m actor_run`, an
example in every command's `--help`, help on every argument, the usage when no command is given,
and `run --help` saying where the ledger and the state live."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from support.cli_inproc import run_cli

import actor_run
from actor_run.supervisors.cli.completion import tree
from actor_run.supervisors.cli.main import _parser, main

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    return sorted(p for p in tree(parser) if p)


def test_version_and_python_m() -> None:
    done = subprocess.run([sys.executable, "-m", "actor_run", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, f"actor-run {actor_run.__version__}")
    bare = subprocess.run([sys.executable, "-m", "actor_run"], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2
    assert bare.stderr.startswith("usage: actor-run")  # no command: the usage (issue 29.11)


def _subparser(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> argparse.ArgumentParser:
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    commands = _commands(parser)
    assert {("run",), ("status",), ("sweep",), ("resume",), ("config", "show"), ("completion",)} <= set(commands)
    for path in [(), *commands]:
        command = f"actor-run {' '.join(path)}".rstrip()
        with pytest.raises(SystemExit) as exit_:
            main([*path, "--help"])
        assert exit_.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: {command}")
        epilog = _subparser(parser, path).epilog or ""  # whatever its wording, an example of the command
        assert "example" in epilog.lower(), f"`{command} --help` shows no example"
        assert command in epilog, f"`{command} --help` shows no example of itself"
        assert epilog.splitlines()[-1].strip() in text  # kept as written (lines not re-wrapped)


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
