"""protocols/clouds/local.py: a delete stops the processes the machine's start script made (by the
pids recorded at their start) and nothing else, whatever another process's command line says."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import trio

from actor_run.protocols.clouds.local import LocalCloud, LocalSettings
from actor_run.protocols.hosts.workspace import Launch
from actor_run.protocols.messages import Offer


def test_delete_kills_only_what_it_started(tmp_path: Path) -> None:
    cloud = LocalCloud(LocalSettings(), tmp_path / "state")

    async def go() -> tuple[int, int, str]:
        offer = Offer(cloud="local", region="this-computer", gpu="", hourly_usd=0.0, candidate=0)
        machine = await cloud.launch(offer, "ar-test-m1", time.time() + 600)
        ws = await cloud.connect(machine)
        try:
            work = ws.work_dir("j", 1, 0)
            pid = await ws.start(Launch(work=work, command="sleep 600", code=None, inputs=[], env={},
                                        lost_after_s=600))
            watchdog = int((Path(work) / "watchdog.pid").read_text())
        finally:
            await ws.aclose()
        return pid, watchdog, machine.root

    job, watchdog, root = trio.run(go)
    # someone else's process that merely names the sandbox on its command line
    bystander = subprocess.Popen(["sh", "-c", 'sleep 600; : "$0"', f"{root}/work/j/1/a0"], start_new_session=True)
    try:
        assert psutil.pid_exists(job)
        assert psutil.pid_exists(watchdog)
        trio.run(cloud.delete, "ar-test-m1")
        assert not Path(root).exists()
        for pid in (job, watchdog):
            gone = not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            assert gone, pid
        assert bystander.poll() is None  # still running
    finally:
        bystander.kill()
        bystander.wait(10)


def test_a_recycled_pid_in_a_pid_file_is_left_alone(tmp_path: Path) -> None:
    """A pid file older than the process that now has that pid names another process."""
    root = tmp_path / "state" / "local" / "ar-test-m2"
    attempt = root / "work" / "j" / "1" / "a0"
    attempt.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (attempt / "pid").write_text(f"{other.pid}\n")
        old = time.time() - 3600
        os.utime(attempt / "pid", (old, old))
        (tmp_path / "state" / "local" / "ar-test-m2.json").write_text("{}")
        trio.run(LocalCloud(LocalSettings(), tmp_path / "state").delete, "ar-test-m2")
        assert other.poll() is None
        assert not root.exists()
    finally:
        other.kill()
        other.wait(10)


def test_delete_kills_a_watchdog_that_has_not_made_its_session_yet(tmp_path: Path) -> None:
    # the start script records the watchdog's pid as it forks it; `setsid` runs after that, so a delete
    # right after a start (a loaded machine) found no process group of that number: the kill of the
    # group missed the watchdog, which then made its session and lived on (seen in a whole run)
    attempt = tmp_path / "state" / "local" / "ar-test-m3" / "work" / "j" / "1" / "a0"
    attempt.mkdir(parents=True)
    os.mkfifo(attempt / "go")  # opened for reading, it blocks until a writer comes: none does
    late = subprocess.Popen(["sh", "-c", 'read -r _ < "$0"; exec setsid sleep 600', str(attempt / "go")])
    try:
        (attempt / "watchdog.pid").write_text(f"{late.pid}\n")
        assert os.getpgid(late.pid) != late.pid  # not its own group yet: it waits on the fifo
        (tmp_path / "state" / "local" / "ar-test-m3.json").write_text("{}")
        trio.run(LocalCloud(LocalSettings(), tmp_path / "state").delete, "ar-test-m3")
        assert late.wait(10) == -signal.SIGKILL
    finally:
        late.kill()
        late.wait(10)
