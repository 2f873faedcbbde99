"""tests/support/cli_inproc.py: `actor-run` run in the test's own process answers as the real child does
(exit code, stdout, stderr, what it wrote), and two calls see nothing of each other."""

from __future__ import annotations

import gc
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import loguru
import pytest

from support.cli_inproc import run_cli, undone

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}
IDS = re.compile(r"\b[0-9a-f]{8}\b|\b\d{2}:\d{2}:\d{2}\b|pid \d+|\d+\.\d+ ?s\b|\b20\d\d-\d\d-\d\d[T ][\d:.+Z-]*"
                 r"|(?<=elapsed )\d+:\d\d|(?<=left ~)\d+:\d\d")  # a loaded machine's second more or less


def batch(tmp: Path, body: str = "", *, name: str = "b.toml") -> Path:
    (tmp / "code").mkdir(exist_ok=True)
    path = tmp / name
    path.write_text(textwrap.dedent(f"""\
        [job]
        name = "t"
        command = "sh -c 'echo seed {{seed}}'"
        code = "code"
        seeds = [1, 2]
        {body}
        [policy]
        poll_s = 0.1
        """))
    return path


def same(text: str) -> list[str]:
    """Lines with ids, times, pids, durations and the call's own state folder masked."""
    return [IDS.sub("*", line).replace("/child/", "/*/").replace("/here/", "/*/") for line in text.splitlines()]


def both(args: list[str], tmp: Path, *, env: dict[str, str] = ENV
         ) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """The command in a child, then in this process (each with its own state folder and ledger)."""
    results = []
    for where, process in (("child", True), ("here", False)):
        state = tmp / where
        done = run_cli([*args, "--state-dir", str(state), "--ledger", str(state / "ledger.sqlite")], cwd=tmp,
                       env=env, process=process)
        results.append(done)
    return results[0], results[1]


def test_version_is_the_same_here_and_in_a_child(tmp_path: Path) -> None:
    child = run_cli(["--version"], env=ENV, process=True)
    here = run_cli(["--version"], env=ENV)
    assert (here.returncode, here.stdout, here.stderr) == (child.returncode, child.stdout, child.stderr)
    assert here.stdout.startswith("actor-run ")
    bare = run_cli([], env=ENV)
    bare_child = run_cli([], env=ENV, process=True)
    assert (bare.returncode, bare.stderr) == (bare_child.returncode, bare_child.stderr) == (2, bare_child.stderr)


def test_a_json_run_then_status_are_the_same_here_and_in_a_child(tmp_path: Path) -> None:
    path = batch(tmp_path)
    child, here = both(["run", str(path), "--json", "--out", "out"], tmp_path)
    assert here.returncode == child.returncode == 0, (child.stderr, here.stderr)
    kinds = [[json.loads(line)["type"] for line in done.stdout.splitlines()] for done in (child, here)]
    assert sorted(kinds[0]) == sorted(kinds[1])
    assert kinds[1].count("JobEnded") == 2
    assert same(here.stderr) == same(child.stderr)  # the run's id line, on stderr with --json
    assert (tmp_path / "out" / "latest").exists()
    child, here = both(["status"], tmp_path)
    assert (here.returncode, same(here.stdout), same(here.stderr)) == (
        child.returncode, same(child.stdout), same(child.stderr))
    assert "2 in the ledger" in here.stdout
    child, here = both(["runs", "--json"], tmp_path)
    rows = [[{k: v for k, v in json.loads(line).items() if k in ("jobs", "state", "batch")}
             for line in done.stdout.splitlines()] for done in (child, here)]
    assert rows[0] == rows[1]
    assert len(rows[1]) == 1


def test_a_bad_batch_is_one_line_and_exit_2_here_as_in_a_child(tmp_path: Path) -> None:
    path = batch(tmp_path, "timeout_s = -3")
    child, here = both(["run", str(path), "--out", "out"], tmp_path)
    assert here.returncode == child.returncode == 2
    assert (here.stdout, here.stderr) == (child.stdout, child.stderr)
    assert len(here.stderr.splitlines()) == 1
    assert "timeout_s" in here.stderr
    child, here = both(["run", str(path), "--no-such-flag"], tmp_path)
    assert (here.returncode, here.stdout, here.stderr) == (child.returncode, child.stdout, child.stderr)
    assert here.returncode == 2


def test_a_failing_job_exits_1_here_as_in_a_child(tmp_path: Path) -> None:
    path = batch(tmp_path).rename(tmp_path / "fail.toml")
    path.write_text(path.read_text().replace("echo seed {seed}", "exit 3"))
    child, here = both(["run", str(path), "--out", "out"], tmp_path)
    assert here.returncode == child.returncode == 1
    assert sorted(same(here.stdout)) == sorted(same(child.stdout))  # two jobs: their lines interleave
    assert sorted(same(here.stderr)) == sorted(same(child.stderr))  # the WARNING lines (loguru's sink)
    assert "WARNING t/seed-1: job ended failed job_failed: the job exited 3" in here.stderr


def test_two_calls_with_other_env_cwd_and_state_do_not_see_each_other(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for d in (one, two):
        d.mkdir()
        batch(d)
    cwd, environ, thresholds = os.getcwd(), dict(os.environ), gc.get_threshold()
    handlers = dict(loguru.logger._core.handlers)  # type: ignore[attr-defined]
    sigint, sigterm = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    streams = (sys.stdin, sys.stdout, sys.stderr)
    # the default ledger is found from $XDG_STATE_HOME (no --state-dir, no --ledger): each call its own
    first = run_cli(["run", "b.toml", "--out", "out"], cwd=one, env={**ENV, "XDG_STATE_HOME": str(one / "xdg")})
    assert first.returncode == 0, first.stderr
    second = run_cli(["runs", "--json"], cwd=two, env={**ENV, "XDG_STATE_HOME": str(two / "xdg")})
    assert (second.returncode, second.stdout) == (0, "")  # not the first call's run
    again = run_cli(["runs", "--json"], cwd=one, env={**ENV, "XDG_STATE_HOME": str(one / "xdg")})
    assert len(again.stdout.splitlines()) == 1
    assert (one / "out" / "latest").exists()
    assert not (two / "out").exists()
    # a variable the first call's env had is not seen by a call without it
    (two / "c.toml").write_text("")
    probe = run_cli(["config", "show"], cwd=two, env={**ENV, "ACTOR_RUN_CONFIG": str(two / "c.toml")})
    plain = run_cli(["config", "show"], cwd=two, env=ENV)
    assert f"user config: {two / 'c.toml'}" in probe.stdout, probe.stderr
    assert "c.toml" not in plain.stdout + plain.stderr
    assert plain.returncode == 0
    # and this process is as it was
    assert (os.getcwd(), dict(os.environ), gc.get_threshold(), gc.get_freeze_count()) == (cwd, environ, thresholds, 0)
    assert dict(loguru.logger._core.handlers) == handlers  # type: ignore[attr-defined]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == (sigint, sigterm)
    assert (sys.stdin, sys.stdout, sys.stderr) == streams


def test_a_run_leaves_this_process_as_a_library_user_had_it(tmp_path: Path) -> None:
    """What a run changes of its process beyond the CLI's own (the collector, loguru) is restored by
    the command itself: a Ctrl-C after `run` or `resume` is the embedder's again (issue 24)."""
    path = batch(tmp_path)
    done = run_cli(["run", str(path), "--out", "out", "--state-dir", str(tmp_path / "s")], cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr
    assert [u for u in undone() if u not in ("loguru handlers", "gc thresholds", "gc freeze")] == []
    resumed = run_cli(["resume", "--state-dir", str(tmp_path / "s")], cwd=tmp_path, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert [u for u in undone() if u not in ("loguru handlers", "gc thresholds", "gc freeze")] == []


def test_a_command_past_its_timeout_is_stopped_and_says_so(tmp_path: Path) -> None:
    path = batch(tmp_path).rename(tmp_path / "slow.toml")
    path.write_text(path.read_text().replace("echo seed {seed}", "sleep 60").replace("[1, 2]", "[1]"))
    with pytest.raises(subprocess.TimeoutExpired):
        run_cli(["run", str(path), "--out", "out", "--state-dir", str(tmp_path / "s")], cwd=tmp_path, env=ENV,
                timeout=3)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
