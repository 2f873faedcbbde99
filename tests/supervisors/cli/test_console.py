"""supervisors/cli/console.py: what the commands share, as a shell pipeline meets it: a reader
whose output nobody reads (`| head -0`) ends quietly."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import CLI

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


@pytest.mark.parametrize("args", [["runs"], ["runs", "--json"], ["status", "--json"], ["cost"], ["cost", "--json"],
                                  ["logs", "t/1"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(three_seeds: Path, args: list[str]) -> None:
    state = three_seeds.parent / "state"
    proc = subprocess.Popen([*CLI, *args, "--ledger", str(three_seeds), "--state-dir", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None
    proc.stdout.close()  # `| head -0`: nobody reads what it writes
    _, err = proc.communicate(timeout=60)
    assert err.decode() == ""
    assert proc.returncode in (0, 141)
