"""Deadlines on time (issue 48.2): a silent job's `timeout_s` ends it within seconds of passing,
whatever the poll interval and the stall windows (a reactor timer, not the stall poll), on `local`
and on the `ssh` cloud, through `actor-run run`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli_inproc import run_cli


@pytest.fixture(params=["local", "ssh"])
def cloud_toml(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "ssh":
        yield request.getfixturevalue("sshd").cloud_toml(tmp_path)
    else:
        yield ""


def test_a_silent_job_ends_at_its_timeout(tmp_path: Path, cloud_toml: str) -> None:
    # the windows (default) are long: nothing but the timeout can end this job early
    path = tmp_path / "b.toml"
    path.write_text("""
[job]
name = "quiet"
command = "sleep 60"
seeds = [1]
timeout_s = 4

[policy]
max_attempts = 1
""" + cloud_toml)
    done = run_cli(["run", str(path), "--json", "--out", str(tmp_path / "out"), "--state-dir",
                    str(tmp_path / "state")], timeout=120, cwd=tmp_path)
    evs = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    started = [e["t"] for e in evs if e["type"] == "JobStarted"]
    ended = [e for e in evs if e["type"] == "JobEnded"]
    assert done.returncode == 1, done.stdout + done.stderr
    assert [e["failure"] for e in ended] == ["job_failed"], done.stdout
    assert "timeout_s" in ended[0]["detail"], ended
    assert len(started) == 1
    assert ended[0]["t"] - started[0] <= 10.0, f"ended {ended[0]['t'] - started[0]:.1f} s after the start"

