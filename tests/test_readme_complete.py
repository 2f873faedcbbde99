"""README.md tells a new user what issue 29.13 found missing: the Python it needs, what `<state>`
is, what "the latest run" means, that SIGTERM is Ctrl-C, every setting of the rented clouds, and a
commands block naming every command and every option of the parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import msgspec

from actor_run.protocols.clouds.rented import VMSettings
from actor_run.supervisors.cli.main import _parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _commands_block() -> str:
    m = re.search(r"## Commands\n\n```\n(.*?)```", README, re.S)
    assert m is not None
    return m.group(1)


def test_the_readme_says_what_a_new_user_needs() -> None:
    text = " ".join(README.split())
    for needed in ("Python 3.11", "python3-venv", "`~/.local/state/actor-run`", "$XDG_STATE_HOME",
                   "started last in the ledger", "SIGTERM is taken as Ctrl-C", "confirm_above_usd"):
        assert needed in text, needed


def test_every_rented_setting_is_in_the_settings_table() -> None:
    for field in msgspec.structs.fields(VMSettings):
        assert f"`{field.name}`" in README, field.name


def test_the_commands_block_names_every_command_and_the_options_people_look_for() -> None:
    block = _commands_block()
    lines = block.splitlines()
    commands = [name for a in _parser()._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]
    for command in commands:
        assert any(line.startswith(f"actor-run {command}") for line in lines), command
    for command, option in [("cost", "--all"), ("run", "--submit-only"), ("worker", "--until-idle"),
                            ("sweep", "--grace"), ("run", "--dry-run"), ("run", "--print-batch"), ("run", "--gpu"),
                            ("run", "--yes"), ("offers", "--max-price"), ("status", "--follow"), ("logs", "--attempt")]:
        assert any(line.startswith(f"actor-run {command}") and option in line for line in lines), (command, option)


def test_ci_runs_the_readmes_try_it_line_from_a_fresh_clone() -> None:
    """.ci/run runs scripts/readme_first_run.sh, which runs the README's own "Try it" line (read
    from the README, so the two never part) in a fresh clone, then `actor-run status`."""
    root = Path(__file__).resolve().parents[1]
    ci = (root / ".ci" / "run").read_text()
    script = (root / "scripts" / "readme_first_run.sh").read_text()
    assert "sh scripts/readme_first_run.sh" in ci
    m = re.search(r"## Try it.*?```sh\n(.*?)\n```", README, re.S)
    assert m is not None
    line = m.group(1)
    assert line.startswith("python3 -m venv .venv && ")
    assert line.endswith(" && .venv/bin/actor-run run examples/seeds.toml")
    assert "git clone" in script
    assert ".venv/bin/actor-run status" in script
