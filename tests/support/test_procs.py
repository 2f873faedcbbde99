"""tests/support/procs.py finds the processes of a folder from /proc as the leak check and the fake
machines need them (tests/conftest.py, fakes/machines.py): real processes, each placed one way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.machines import _kill_under
from psutil._common import parse_environ_block

from support import procs
from support.waits import poll

# forks twice (its parent exits: init adopts it), goes to argv[1], says its pid, and becomes `sleep`
# (its command line then names nothing of the folder)
DAEMON = """
import os, sys
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
os.chdir(sys.argv[1])
with open(sys.argv[2], "w") as f:
    f.write(str(os.getpid()))
os.execvp("sleep", ["sleep", "300"])
"""


def _gone(pid: int) -> bool:
    try:
        return procs.zombie(pid)
    except OSError:
        return True


class Placed:
    """Four processes and how each relates to `folder`: `daemon` (double-forked, its cwd in it),
    `home` (its HOME in it), `named` (the folder only in its command line), `other` (none of these:
    its cwd and HOME elsewhere, the folder in another variable). All killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path / "machine"
        (self.folder / "home" / "work").mkdir(parents=True)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(elsewhere)}
        self.children: list[subprocess.Popen[bytes]] = []
        pid_file = tmp_path / "daemon.pid"
        subprocess.run([sys.executable, "-c", DAEMON, str(self.folder / "home" / "work"), str(pid_file)],
                       env=env, cwd=elsewhere, check=True, timeout=60)
        self.daemon = int(poll(lambda: pid_file.exists() and pid_file.read_text(), 30, "the daemon's pid"))
        poll(lambda: _read(f"/proc/{self.daemon}/cmdline") == b"sleep\x00300\x00", 30, "the daemon's exec")
        self.home = self._start(["sleep", "300"], {**env, "HOME": str(self.folder / "home")}, elsewhere)
        self.named = self._start([sys.executable, "-c", "import time; time.sleep(300)", str(self.folder / "x")],
                                 env, elsewhere)
        self.other = self._start(["sleep", "300"], {**env, "WORK": str(self.folder)}, elsewhere)
        poll(lambda: b"time.sleep" in _read(f"/proc/{self.named}/cmdline"), 30, "python's start")

    def _start(self, argv: list[str], env: dict[str, str], cwd: Path) -> int:
        child = subprocess.Popen(argv, env=env, cwd=cwd)
        self.children.append(child)
        return child.pid

    def close(self) -> None:
        for child in self.children:
            child.kill()
            child.wait(30)
        if not _gone(self.daemon):
            os.kill(self.daemon, signal.SIGKILL)
        poll(lambda: _gone(self.daemon), 30, "the daemon's end")


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.fixture
def placed(tmp_path: Path) -> Iterator[Placed]:
    p = Placed(tmp_path)
    try:
        yield p
    finally:
        p.close()


def test_a_folders_processes_by_cwd_home_or_command_line(placed: Placed) -> None:
    found = {pid for pid, _ in procs.under(placed.folder, cwd_home=True)}
    assert found == {placed.daemon, placed.home, placed.named}


def test_by_command_line_alone_only_the_one_that_names_the_folder(placed: Placed) -> None:
    found = procs.under(placed.folder)
    assert [pid for pid, _ in found] == [placed.named]
    assert found[0][1].split(b"\0")[-2] == os.fsencode(placed.folder / "x")


def test_a_fake_machines_end_kills_its_processes_and_no_other(placed: Placed) -> None:
    _kill_under(placed.folder)
    for child in placed.children:
        if child.pid != placed.other:
            assert child.wait(30) == -signal.SIGKILL
    poll(lambda: _gone(placed.daemon), 30, "the daemon's end")
    assert placed.children[-1].poll() is None  # `other` lives on


def test_descendants_are_children_and_theirs() -> None:
    top = subprocess.Popen(["sh", "-c", 'sh -c "sleep 300 & wait" & sleep 300 & wait'])
    try:
        # the inner sh and its sleep, and the outer sleep, once each forked shell has exec'd its command
        # (a child just forked still reads as its parent `sh`)
        def grown() -> dict[int, bytes] | None:
            names = {pid: _read(f"/proc/{pid}/cmdline").split(b"\0")[0] for pid in procs.descendants(top.pid)}
            return names if sorted(names.values()) == [b"sh", b"sleep", b"sleep"] else None

        names = poll(grown, 30, "the tree")
        inner = next(pid for pid, name in names.items() if name == b"sh")
        assert [names[pid] for pid in procs.descendants(inner)] == [b"sleep"]
        assert all(procs.descendants(pid) == [] for pid, name in names.items() if name == b"sleep")
    finally:
        kin = procs.descendants(top.pid)
        for pid in [top.pid, *kin]:
            os.kill(pid, signal.SIGKILL)
        top.wait(30)
        poll(lambda: all(_gone(pid) for pid in kin), 30, "the tree's end")
    assert procs.descendants(top.pid) == []


@pytest.mark.parametrize("environ", [
    b"", b"\0", b"A=1\0HOME=/x\0", b"HOME=/a\0B=2\0HOME=/b\0", b"A=1\0\0HOME=/x\0", b"\0HOME=/x\0",
    b"A=1\0HOME=/x", b"HOME=/y\0HOME=/x", b"XHOME=/z\0", b"HOME=\0", b"=HOME=/q\0", b"A\0HOME=/r\0",
])
def test_home_is_read_as_psutil_reads_it(environ: bytes) -> None:
    """The environ block psutil parses (the scan it replaced): the same HOME, whatever the block's mess."""
    assert procs._home(environ) == os.fsencode(parse_environ_block(environ.decode()).get("HOME", ""))
