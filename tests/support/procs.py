"""The processes of this machine that belong to a folder, read from /proc directly: the test-side
scans run after every test (tests/conftest.py) and at every fake machine's end (fakes/machines.py),
over every process, and psutil's objects (one per process, with its cwd and whole environment
parsed) cost several times more than a read of the bytes needed.

    under(path)                  # [(pid, cmdline)]: each process whose command line names path
    under(path, cwd_home=True)   # also one whose cwd is under path, or whose HOME is
    descendants(pid)             # its children, theirs, ...: [pid, ...]
    zombie(pid)                  # it has ended and waits for its parent to reap it

Each pid's `cmdline` is read first; its `cwd` link and `environ` only when the command line does not
name the folder. A process that ends or is not ours to read while it is looked at is left out (a
zombie's cmdline is empty and its cwd unreadable: found only in the moment it becomes one), and so
is the caller's own pid. Any thread.
"""

from __future__ import annotations

import os
from pathlib import Path


def _read(path: str) -> bytes:
    """The whole file; OSError if it cannot be read. A bare descriptor: a Python file object costs
    twice what the read of a /proc file does."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _home(environ: bytes) -> bytes:
    """HOME's value in a /proc environ as psutil reads one (NUL-ended `NAME=value` entries up to the
    first empty one, the last HOME winning), or b"". Found, not split: an environ may hold hundreds of entries."""
    block = b"\0" + environ  # every entry now starts after a NUL
    end = block.find(b"\0\0")
    block = block[: end + 1] if end >= 0 else block[: block.rfind(b"\0") + 1]  # an entry is NUL-ended
    at = block.rfind(b"\0HOME=")
    if at < 0:
        return b""
    return block[at + 6 : block.index(b"\0", at + 6)]


def zombie(pid: int) -> bool:
    """Whether `pid` is a zombie (its state in /proc/PID/stat, after "(comm) "); OSError if it is gone."""
    stat = _read(f"/proc/{pid}/stat")
    end = stat.rfind(b")")  # comm may hold anything, ")" too
    if end < 0:
        raise ProcessLookupError(pid)  # read as it went
    return stat[end + 2 : end + 3] == b"Z"


def under(path: Path | str, *, cwd_home: bool = False) -> list[tuple[int, bytes]]:
    """The processes whose command line names `path` (anywhere in one of its arguments), and
    with `cwd_home` also those whose working folder or HOME starts with it: each (pid, raw cmdline)."""
    marker = os.fsencode(str(path))
    me = os.getpid()
    found = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            pid = entry.name
            if not pid.isdigit() or int(pid) == me:
                continue
            try:
                cmd = _read(f"/proc/{pid}/cmdline")
                if marker not in cmd:  # marker holds no NUL: in the bytes is in one argument
                    if not cwd_home:
                        continue
                    try:  # a job started there: its folder is its cwd, or its environment names it (HOME)
                        cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd"))
                    except OSError:  # gone, not ours, or a zombie: no cwd to read; its environ neither
                        continue
                    if not cwd.startswith(marker) and not _home(_read(f"/proc/{pid}/environ")).startswith(marker):
                        continue
            except OSError:  # ended meanwhile, or not ours to read
                continue
            found.append((int(pid), cmd))
    return found


def descendants(pid: int) -> list[int]:
    """`pid`'s children, their children and so on (from each thread's /proc children list), as
    they are at this moment; [] for a process that is gone."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = [int(k) for k in _read(f"/proc/{parent}/task/{tid}/children").split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out
