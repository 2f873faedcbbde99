"""supervisors/cli/detach.py: `actor-run run --detach` (issue 41), through the real command line.
The parent checks the batch, starts the run's controller in a session of its own and exits; the
controller outlives the shell that started it, and `status`, `cancel` and `resume` work on its run
as on any other. Each job waits for a gate file the test makes (bounded: 120 s), then succeeds."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
from support.cli_inproc import CLI, run_cli
from support.waits import poll

from actor_run.protocols.clouds.sim import sim_machines
from actor_run.supervisors.ledger import LedgerReader

ENV = {**os.environ, "NO_COLOR": "1", "COLUMNS": "160"}

GATED = """\
[job]
name = "t"
command = "sh -c 'echo hi {{seed}}; for i in $(seq 1 1200); do [ -e \\"$GATE\\" ] && exit 0; sleep 0.1; done; exit 3'"
seeds = [1, 2]
env = {{ GATE = "{gate}" }}
public_env = ["GATE"]

[policy]
poll_s = 0.1
max_attempts = 1

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.2
"""


class Place:
    """A test's state folder, ledger, results and gate, and the commands on them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.ledger = tmp / "l.sqlite"
        self.gate = tmp / "gate"
        self.batch = tmp / "b.toml"
        self.batch.write_text(GATED.format(gate=self.gate))

    def common(self) -> list[str]:
        return ["--state-dir", str(self.state), "--ledger", str(self.ledger)]

    def detach_args(self, *extra: str) -> list[str]:
        return [*CLI, "run", str(self.batch), *self.common(), "--out", str(self.tmp / "out"), "--detach", *extra]

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return run_cli([*args, *self.common()], timeout=timeout, env=ENV)

    def status(self, run: str) -> list[dict[str, Any]]:
        done = self.cli("status", "--run", run, "--json")
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def machines(self) -> list[Any]:
        if not self.ledger.exists():
            return []
        reader = LedgerReader(self.ledger)
        try:
            return reader.machines()
        finally:
            reader.close()

    def both_running(self) -> list[Any]:
        rows = [m for m in self.machines() if m.state == "alive" and m.phase == "running"]
        return rows if len(rows) == 2 else []

    def sim_left(self) -> list[str]:
        return sim_machines(self.state / "sim")


def started(stdout: str) -> tuple[str, int]:
    """The run id and the controller's pid the parent printed."""
    found = re.search(r"^run (\w+): 2 job\(s\)", stdout, re.M)
    pid = re.search(r"runs in the background \(pid (\d+)\)", stdout)
    assert found, stdout
    assert pid, stdout
    return found.group(1), int(pid.group(1))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # its parent exited: nobody reaps it here
    except psutil.NoSuchProcess:
        return True


def stop(pid: int) -> None:
    """A controller a failed test left: killed (its machines are the sweep's then)."""
    if not gone(pid):
        os.kill(pid, signal.SIGKILL)


def test_a_detached_run_outlives_the_shell_that_started_it(tmp_path: Path) -> None:
    """`actor-run run --detach` from a shell whose whole process group is then killed (a closed
    terminal: SIGHUP, then SIGKILL): the run goes on, succeeds, and leaves no machine."""
    place = Place(tmp_path)
    line = shlex.join(place.detach_args())
    shell = subprocess.Popen(["sh", "-c", f"{line}; echo \"exit $?\"; exec cat"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                             start_new_session=True)  # a group of its own, as a terminal's shell has
    pid = 0
    try:
        assert shell.stdout is not None
        said = ""
        while "exit " not in said:  # bounded by the parent's own exit (READY_S at most)
            chunk = shell.stdout.readline()
            assert chunk, said
            said += chunk
        assert "exit 0" in said, said + shell.communicate(timeout=30)[1]
        run, pid = started(said)
        assert f"actor-run status --follow --run {run}" in said
        assert f"actor-run logs t/1 -f --run {run}" in said
        assert f"actor-run cancel {run}" in said
        assert psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # started, and alive
        assert os.getsid(pid) == pid != os.getsid(shell.pid)  # a session of its own
        os.killpg(shell.pid, signal.SIGHUP)  # the terminal closes: its whole group is told, then killed
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(30)
        poll(place.both_running, 90, "both seeds running after the shell was killed")
        assert not gone(pid)
        place.gate.touch()
        poll(lambda: gone(pid), 120, "the detached controller to end")
        rows = place.status(run)
        assert [r["state"] for r in rows if r["kind"] == "run"] == ["succeeded"]
        assert {r["state"] for r in rows if r["kind"] == "job"} == {"succeeded"}
        assert {r["state"] for r in rows if r["kind"] == "machine"} == {"deleted"}
        assert place.sim_left() == []
        log = (place.state / "runs" / run / "controller.log").read_text()
        assert f"run {run}: 2 job(s)" in log  # its output went to the run's log
        assert "job ended succeeded" in log
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
        if pid:
            stop(pid)


def test_cancel_of_a_detached_run_deletes_its_machines(tmp_path: Path) -> None:
    place = Place(tmp_path)
    done = subprocess.run(place.detach_args(), capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run, pid = started(done.stdout)
    try:
        poll(place.both_running, 90, "both seeds running")
        canceled = place.cli("cancel", run)
        assert canceled.returncode == 0, canceled.stdout + canceled.stderr
        assert "asked the controller(s) of 2 job(s) to cancel them" in canceled.stdout
        jobs = [r for r in place.status(run) if r["kind"] == "job"]
        assert {(j["state"], j["failure"]) for j in jobs} == {("failed", "canceled")}
        poll(lambda: gone(pid), 60, "the detached controller to end")
        assert {m.state for m in place.machines()} == {"deleted"}
        assert place.sim_left() == []
    finally:
        stop(pid)


def test_a_killed_detached_controller_is_resumed(tmp_path: Path) -> None:
    """kill -9 of the background controller: its owner row names its pid, so `resume` knows it
    is dead and takes its jobs over, as for any controller."""
    place = Place(tmp_path)
    done = subprocess.run(place.detach_args(), capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run, pid = started(done.stdout)
    try:
        poll(place.both_running, 90, "both seeds running")
        reader = LedgerReader(place.ledger)
        try:
            assert pid in {o.pid for o in reader.owners()}  # the ledger knows the controller by its pid
        finally:
            reader.close()
        os.kill(pid, signal.SIGKILL)
        poll(lambda: gone(pid), 30, "the controller killed")
        place.gate.touch()
        resumed = place.cli("resume", run, timeout=240)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        rows = place.status(run)
        assert {r["state"] for r in rows if r["kind"] == "job"} == {"succeeded"}
        assert place.sim_left() == []
    finally:
        stop(pid)


def test_bad_input_with_detach_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    """Bad input the parent finds (the flags) and bad input only the controller's check finds (a
    GPU name the cloud does not know): exit 2, one line, no run, no controller left."""
    place = Place(tmp_path)
    done = run_cli(["run", str(place.batch), *place.common(), "--out", str(tmp_path / "out"), "--detach",
                    "--concurrency", "0"], timeout=120, env=ENV)
    assert done.returncode == 2
    assert done.stderr == "actor-run: argument --concurrency: expected int >= 1, got 0\n"
    done = run_cli(["run", str(place.batch), *place.common(), "--out", str(tmp_path / "out"), "--detach",
                    "--gpu", "B999"], timeout=300, env=ENV)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("actor-run: candidates[0].gpu: unknown GPU for sim 'B999'"), done.stderr
    assert done.stdout == ""
    reader = LedgerReader(place.ledger)
    try:
        assert reader.runs() == []
    finally:
        reader.close()
    assert not (place.state / "runs").exists() or list((place.state / "runs").iterdir()) == []
