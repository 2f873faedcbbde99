"""supervisors/cli/completion.py: bash and zsh completion scripts made from the parser, following
its command tree (a command added later included)."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import run_cli

from actor_run.supervisors.cli.completion import bash_script, tree, zsh_script
from actor_run.supervisors.cli.main import _parser


def _commands(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    return sorted(p for p in tree(parser) if p)


def _bash(script: str, words: list[str], cwd: Path) -> list[str]:
    line = " ".join(f"'{w}'" for w in words)
    program = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _actor_run\n"
               'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def _zsh(script: str, words: list[str], cwd: Path) -> list[str]:
    # outside a completion widget: compadd and _files print what they were given
    line = " ".join(f"'{w}'" for w in words)
    program = (f"compadd() {{ shift; print -l -- \"$@\" }}\n_files() {{ print -- '<files>' }}\n"
               f"compdef() {{ : }}\n{script}\nwords=({line}); CURRENT={len(words)}; _actor_run")
    done = subprocess.run(["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=30, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_follows_the_command_tree(shell: str, tmp_path: Path) -> None:
    done = run_cli(["completion", shell], timeout=60, env={**os.environ, "NO_COLOR": "1"})
    assert done.returncode == 0, done.stderr
    script = done.stdout
    complete = _bash if shell == "bash" else _zsh
    (tmp_path / "sweep.toml").write_text("")

    def words(*typed: str) -> set[str]:
        return set(complete(script, ["actor-run", *typed], tmp_path))

    assert {"run", "status", "sweep", "resume", "config", "completion", "--version", "--config"} <= words("")
    assert {"--concurrency", "--json", "--out", "--config"} <= words("run", "--")
    assert "--grace" not in words("run", "--")  # sweep's, not run's
    assert {"--dry-run", "--gpu", "--print-batch", "--yes"} <= words("run", "--")
    assert "show" in words("config", "")
    assert {"--json"} <= words("--config", "user.toml", "config", "show", "--")  # an option's value is no command
    assert {"bash", "zsh"} <= words("completion", "")
    files = "sweep.toml" if shell == "bash" else "<files>"
    assert files in words("run", "sw")  # a path goes there
    assert files in words("config", "show", "")
    assert files in words("status", "--ledger", "")  # an option's value
    assert files not in words("status", "")  # no path goes there
    assert files not in words("config", "s")
    if shell == "bash":
        assert words("config", "s") == {"show"}


def test_a_command_added_later_completes_without_editing_the_generator(tmp_path: Path) -> None:
    parser = _parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    extra = sub.add_parser("frobnicate", help="a command another change adds")
    extra.add_argument("--loudly", action="store_true")
    extra.add_argument("mode", choices=["fast", "slow"])
    assert {"frobnicate"} <= set(_bash(bash_script(parser), ["actor-run", "fro"], tmp_path))
    assert {"--loudly", "fast", "slow"} <= set(_bash(bash_script(parser), ["actor-run", "frobnicate", ""], tmp_path))
    assert {"--loudly"} <= set(_zsh(zsh_script(parser), ["actor-run", "frobnicate", "--"], tmp_path))
