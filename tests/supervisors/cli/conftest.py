"""What the command tests share: a ledger with one finished run, made once per test process."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from support.cli_inproc import run_cli

PLAIN_ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}

THREE_SEEDS = """\
[job]
name = "t"
command = "sh -c 'echo hello {seed}'"
seeds = [1, 2, 3]

[policy]
poll_s = 0.1
"""


@pytest.fixture(scope="session")
def three_seeds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ledger with one finished run of three seeds (`echo hello <seed>`), its state folder beside it;
    for commands that only read it."""
    tmp = tmp_path_factory.mktemp("ran")
    (tmp / "b.toml").write_text(textwrap.dedent(THREE_SEEDS))
    done = run_cli(["run", str(tmp / "b.toml"), "--state-dir", str(tmp / "state"), "--ledger",
                    str(tmp / "l.sqlite"), "--out", str(tmp / "out")], timeout=180, env=PLAIN_ENV)
    assert done.returncode == 0, done.stderr
    return tmp / "l.sqlite"
