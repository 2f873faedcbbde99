"""supervisors/cli/logs.py: `actor-run logs -f` on a running local job prints its lines while the job
writes them, follows it onto a fresh machine when it is retried (its first attempt goes silent and
stalls), and exits when the job has ended. Then the same log, whole and by attempt, without -f."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support.cli_inproc import run_cli
from support.process_kit import Output
from test_cli import CLI, ENV, Paths, batch, cli, poll

from actor_run.supervisors.ledger import LedgerReader

# the first attempt says so, ticks until the test opens the gate, then goes silent: stalled, retried
JOB = """\
[job]
name = "t"
command = "sh job.sh"
code = "code"
seeds = [1]

[policy]
poll_s = 0.1
setup_grace_s = 60
stall_after_s = 1.5
backoff_s = 0.05
max_attempts = 3
"""
SCRIPT = """\
if [ "$ACTOR_RUN_ATTEMPT" = 0 ]; then
  echo '{{"stage": "train"}}' >> "$ACTOR_RUN_PROGRESS"
  echo "first attempt is here"
  i=0
  while [ ! -e {gate} ] && [ $i -lt 600 ]; do echo tick; sleep 0.1; i=$((i + 1)); done
  echo "first attempt goes quiet"
  sleep 30
fi
echo "second attempt is here"
"""


@pytest.fixture
def paths(tmp_path: Path) -> Paths:
    return Paths(tmp_path)


def test_logs_follows_a_job_across_a_retry_and_ends_with_it(paths: Paths) -> None:
    gate = paths.tmp / "gate"
    path = batch(paths.tmp, JOB)
    (paths.tmp / "code" / "job.sh").write_text(SCRIPT.format(gate=gate))
    run = subprocess.Popen(paths.run_args(path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env=ENV)
    follow = None
    try:
        def recorded() -> bool:
            if not paths.ledger.exists():
                return False
            reader = LedgerReader(paths.ledger)
            try:
                return any(j["name"] == "t" for j in reader.jobs())
            finally:
                reader.close()

        poll(recorded, 60, "the job in the ledger")
        follow = subprocess.Popen([*CLI, "logs", "t/1", "-f", *paths.common()], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=ENV)
        out = Output(follow.stdout)
        out.wait_for(" attempt 0 on local", 60)
        out.wait_for("first attempt is here", 60)  # live: the job is still running, waiting for the gate
        out.wait_for("tick", 30)
        assert run.poll() is None
        gate.touch()
        out.wait_for("first attempt goes quiet", 30)
        out.wait_for(" attempt 1 on local", 60)  # the retry, on a fresh machine
        out.wait_for("second attempt is here", 60)
        assert follow.wait(60) == 0  # it ends with the job
        assert run.wait(60) == 0
    finally:
        for proc in (follow, run):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        if run.stderr is not None:
            run.stderr.close()
        if follow is not None and follow.stderr is not None:
            follow.stderr.close()
    text = out.rest()
    assert text.index("first attempt goes quiet") < text.index(" attempt 1 on") < text.index("second attempt")

    whole = cli([*CLI, "logs", "t", *paths.common()])  # one seed: the name is enough
    assert whole.returncode == 0, whole.stderr
    assert whole.stdout == (paths.out / "latest" / "t" / "seed-1" / "log.txt").read_text()
    second = cli([*CLI, "logs", "t/seed-1", "--attempt", "1", *paths.common()])
    assert second.returncode == 0, second.stderr
    assert re.match(r"--- run [0-9a-f]+ attempt 1 on local", second.stdout), second.stdout[:200]
    assert "second attempt is here" in second.stdout
    assert "first attempt" not in second.stdout


@pytest.mark.parametrize(("target", "message"), [
    ("t/x", "JOB[/SEED]: the seed must be a number, got 'x'"),
    ("nope/1", "job: no job nope/1 in any run of this ledger"),
])
def test_logs_of_a_bad_target_exits_2_with_one_line(paths: Paths, target: str, message: str) -> None:
    LedgerReader(paths.ledger).close()  # a ledger with no run (a missing one is its own exit 2: test_newcomer.py)
    done = cli([*CLI, "logs", target, *paths.common()])
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"actor-run: {message}"]


PLAIN_ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}


def on_ledger(ledger: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--ledger", str(ledger), "--state-dir", str(ledger.parent / "state")],
                          timeout=60, env=PLAIN_ENV)


def test_logs_of_an_attempt_that_is_not_there_names_those_that_are(three_seeds: Path) -> None:
    done = on_ledger(three_seeds, "logs", "t/2", "--attempt", "5")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "--attempt 5: t/seed-2 has attempt(s) 0 in run " in done.stderr
    there = on_ledger(three_seeds, "logs", "t/2", "--attempt", "0")
    assert there.returncode == 0
    assert "hello 2" in there.stdout
