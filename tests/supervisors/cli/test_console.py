"""supervisors/cli/console.py: what the commands share, as a shell pipeline meets it: a reader
whose output nobody reads (`| head -0`) ends quietly."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from support.cli_inproc import CLI, run_cli

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
