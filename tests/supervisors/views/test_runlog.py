"""supervisors/views/runlog.py: `actor-run run` writes its controller's log to a file of the run's under the
state folder, every line naming the job and attempt it is about; `actor-run runs` says where."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_cli import CLI, GOOD, Paths, batch, cli


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)


def test_each_run_logs_to_its_own_file_with_job_and_attempt_on_each_line(paths: Paths) -> None:
    path = batch(paths.tmp, GOOD.replace("sh -c 'echo {seed}'", "sh -c 'test {seed} = 2 && exit 3; echo ok'")
                 .replace("[1]", "[1, 2]"))
    assert cli(paths.run_args(path)).returncode == 1  # seed 2 fails
    assert cli(paths.run_args(path)).returncode == 1  # a second run of the same batch
    listed = cli([*CLI, "runs", "--json", *paths.common()])
    assert listed.returncode == 0, listed.stderr
    runs = [json.loads(line) for line in listed.stdout.splitlines()]
    assert len(runs) == 2
    logs = [Path(r["log"]) for r in runs]
    assert logs == [paths.state / "runs" / r["id"] / "controller.log" for r in runs]
    for r, log in zip(runs, logs, strict=True):
        lines = log.read_text().splitlines()
        line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (INFO|WARNING) +(t/seed-[12]) (a\d+) (.+)$")
        parsed = [line.match(x) for x in lines]
        assert lines
        assert all(parsed), [x for x, m in zip(lines, parsed, strict=True) if m is None]
        said = {(m.group(2), m.group(3), m.group(4)) for m in parsed if m is not None}
        assert ("t/seed-1", "a0", "job ended succeeded after 1 attempt(s), $0.0000") in said
        assert ("t/seed-2", "a0", "job exited 3") in said
        assert any(m.group(1) == "WARNING" and m.group(2) == "t/seed-2" and "job ended failed job_failed" in m.group(4)
                   for m in parsed if m is not None)
        assert r["id"] in str(log)
    human = cli([*CLI, "runs", *paths.common()])
    assert f"each run's controller log: {paths.state / 'runs' / '<run>' / 'controller.log'}" in human.stdout
