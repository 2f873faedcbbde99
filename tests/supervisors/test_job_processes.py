"""A job's processes are one unit (issue 48.1): whatever an attempt starts, however it detaches (a
double fork into a new session, `setsid nohup`), is gone within 5 s of each way the attempt can
end, on `local` and on the `ssh` cloud (a real sshd on loopback), through the `actor-run` command
as a user runs it. The daemons write their pids to a file outside the machine; psutil checks them.
A process outside the attempt with the same command line (and another attempt's mark) stays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.cli_inproc import run_cli, start_cli
from support.sshd import Sshd
from support.waits import poll

# two daemons that leave the job's session and group: a double fork (the grandchild in a session of
# its own, its parent gone) and `setsid nohup`; and one that clears its environment (no mark) but
# stays in the job's session; then the job ends, hangs, or waits for a gate
JOB = r"""
sh -c 'setsid sh -c "sleep 300 & echo \$! >> \"$DAEMONS/pids\"" &'
setsid nohup sleep 301 > /dev/null 2>&1 &
echo $! >> "$DAEMONS/pids"
env -i sleep 302 > /dev/null 2>&1 &
echo $! >> "$DAEMONS/pids"
while [ "$(wc -l < "$DAEMONS/pids")" -lt 3 ]; do sleep 0.05; done
echo started
case "$MODE" in
  end) exit 0;;
  gate) while [ ! -e "$DAEMONS/gate" ]; do sleep 0.1; done; exit 0;;
  *) exec sleep 600;;
esac
"""

GONE_S = 5.0


def batch(tmp: Path, cloud: str, sshd: Sshd | None, *, mode: str, timeout_s: float = 300,
          lost_after_s: float = 30) -> Path:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "job.sh").write_text(JOB)
    daemons = tmp / "daemons"
    daemons.mkdir(exist_ok=True)
    path = tmp / "b.toml"
    text = f"""
[job]
name = "d"
command = "sh job.sh"
code = "code"
seeds = [1]
timeout_s = {timeout_s}
env = {{ DAEMONS = "{daemons}", MODE = "{mode}" }}

[policy]
max_attempts = 1
poll_s = 0.2
lost_after_s = {lost_after_s}
"""
    if cloud == "ssh":
        assert sshd is not None
        text += sshd.cloud_toml(tmp)
    path.write_text(text)
    return path


def cli(tmp: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return run_cli([*args, "--state-dir", str(tmp / "state")], timeout=timeout, cwd=tmp)


def start_run(tmp: Path, path: Path) -> subprocess.Popen[str]:
    return start_cli(["run", str(path), "--json", "--out", str(tmp / "out"), "--state-dir", str(tmp / "state")],
                     cwd=tmp)


def pids(tmp: Path) -> list[int]:
    try:
        return [int(x) for x in (tmp / "daemons" / "pids").read_text().split()]
    except (OSError, ValueError):
        return []


def is_daemon(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.cmdline()[:1] == ["sleep"] and p.cmdline()[1:] in (
            ["300"], ["301"], ["302"])
    except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
        return False


def all_daemons_running(tmp: Path) -> list[int]:
    found = pids(tmp)
    return found if len(found) == 3 and all(is_daemon(p) for p in found) else []


def assert_gone_soon(tmp: Path, ended: float) -> None:
    """Every daemon the job left is gone within GONE_S of `ended` (time.monotonic()); the job was
    started once (one set of three)."""
    found = pids(tmp)
    assert len(found) == 3, f"the job wrote {found}"
    poll(lambda: not any(is_daemon(p) for p in found), max(0.1, ended + GONE_S - time.monotonic()),
         f"the job's daemons {found} to be gone within {GONE_S} s")


@pytest.fixture
def bystander() -> Iterator[psutil.Process]:
    """A process outside any attempt with the daemons' command line, in a session of its own, and
    another attempt's mark: nothing may end it."""
    env = {**os.environ, "ACTOR_RUN_TAG": "actor-run-0123456789abcdef"}
    proc = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        yield psutil.Process(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=60)


def _cleanup(tmp: Path) -> None:
    """Whatever a failed test left: its daemons (their command line does not name tmp), and its machines."""
    for pid in pids(tmp):
        if is_daemon(pid):
            os.kill(pid, signal.SIGKILL)


CLOUDS = ["local", "ssh"]


@pytest.fixture(params=CLOUDS)
def cloud(request: pytest.FixtureRequest) -> Iterator[tuple[str, Sshd | None]]:
    if request.param == "ssh":
        yield "ssh", request.getfixturevalue("sshd")
    else:
        yield "local", None


def test_daemons_end_with_a_normal_end(tmp_path: Path, cloud: tuple[str, Sshd | None],
                                       bystander: psutil.Process) -> None:
    path = batch(tmp_path, *cloud, mode="end")
    try:
        done = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
        ended = time.monotonic()
        assert done.returncode == 0, done.stdout + done.stderr
        assert_gone_soon(tmp_path, ended)
        assert bystander.is_running()
    finally:
        _cleanup(tmp_path)


def test_daemons_end_with_a_timeout(tmp_path: Path, cloud: tuple[str, Sshd | None],
                                    bystander: psutil.Process) -> None:
    path = batch(tmp_path, *cloud, mode="hang", timeout_s=4)
    try:
        done = cli(tmp_path, "run", str(path), "--json", "--out", str(tmp_path / "out"))
        ended = time.monotonic()
        assert done.returncode == 1, done.stdout + done.stderr
        ends = [json.loads(x) for x in done.stdout.splitlines() if '"type":"JobEnded"' in x]
        assert [e["failure"] for e in ends] == ["job_failed"], done.stdout
        assert_gone_soon(tmp_path, ended)
        assert bystander.is_running()
    finally:
        _cleanup(tmp_path)


def test_daemons_end_with_a_cancel(tmp_path: Path, cloud: tuple[str, Sshd | None],
                                   bystander: psutil.Process) -> None:
    path = batch(tmp_path, *cloud, mode="hang")
    proc = start_run(tmp_path, path)
    try:
        poll(lambda: all_daemons_running(tmp_path), 120, "the job's three daemons")
        done = cli(tmp_path, "cancel", "d/1")
        ended = time.monotonic()
        assert done.returncode == 0, done.stdout + done.stderr
        assert_gone_soon(tmp_path, ended)
        proc.communicate(timeout=120)
        assert proc.returncode == 3  # canceled from elsewhere, nothing failed (README: exit codes)
        assert bystander.is_running()
    finally:
        _kill(proc)
        _cleanup(tmp_path)


@pytest.mark.parametrize("after", ["sweep", "resume"])
def test_daemons_end_after_a_killed_controller(tmp_path: Path, cloud: tuple[str, Sshd | None], after: str,
                                               bystander: psutil.Process) -> None:
    """kill -9 of the controller, then `sweep` (the dead owner's machine is deleted) or `resume` (the
    attempt is taken over and watched until its timeout_s ends it): either way nothing the job
    started is left, and a resumed attempt starts no second pair."""
    path = batch(tmp_path, *cloud, mode="hang", timeout_s=20 if after == "resume" else 300)
    proc = start_run(tmp_path, path)
    try:
        poll(lambda: all_daemons_running(tmp_path), 120, "the job's three daemons")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        if after == "sweep":
            done = cli(tmp_path, "sweep")
            assert " deleted " in done.stdout, done.stdout + done.stderr
        else:  # the takeover watches the job until its timeout_s ends it
            done = cli(tmp_path, "resume", "--json")
            assert '"type":"JobEnded"' in done.stdout, done.stdout + done.stderr
        ended = time.monotonic()
        assert done.returncode in (0, 1), done.stdout + done.stderr
        # one set of three: a controller killed between the job's start and the ledger's record of it
        # (deterministic over SSH) once had its resumed attempt start the job a second time
        assert_gone_soon(tmp_path, ended)
        assert bystander.is_running()
    finally:
        _kill(proc)
        _cleanup(tmp_path)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_daemons_end_with_the_watchdog(tmp_path: Path, cloud: tuple[str, Sshd | None], how: signal.Signals,
                                       bystander: psutil.Process) -> None:
    """The controller is killed, or stopped (it lives but writes no heartbeat): the host's watchdog
    ends the job after lost_after_s and everything the job started with it."""
    lost = 2
    path = batch(tmp_path, *cloud, mode="hang", lost_after_s=lost)
    proc = start_run(tmp_path, path)
    try:
        poll(lambda: all_daemons_running(tmp_path), 120, "the job's three daemons")
        proc.send_signal(how)
        silent = time.monotonic()
        # the watchdog gives up after lost + min(60, lost) s, checking every second; then TERM, 2 s, KILL
        limit = lost + min(60, lost) + 1 + 2
        found = pids(tmp_path)
        poll(lambda: not any(is_daemon(p) for p in found), limit + GONE_S + (time.monotonic() - silent),
             "the watchdog to end the job's daemons")
        assert bystander.is_running()
    finally:
        proc.send_signal(signal.SIGKILL)
        _kill(proc)
        _cleanup(tmp_path)
    swept = cli(tmp_path, "sweep")  # the dead controller's machine
    assert swept.returncode == 0, swept.stdout + swept.stderr
