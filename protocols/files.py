"""Files only the user may read: what actor-run writes on this computer (a job's log and response,
the controller's log) is 0600 whatever the umask, since a job's output may hold what it was given."""

from __future__ import annotations

import os
from pathlib import Path


def private_opener(path: str, flags: int) -> int:
    """`open(..., opener=private_opener)`: the file is made 0600, and an existing one made so."""
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def write_private(path: str | Path, data: bytes) -> None:
    """`data` as the whole of the file at `path`, made 0600 (an existing one too). On the descriptor
    itself: no file object to build, nor the `fstat` its making costs (a response.json per job, ten
    thousand in an end burst)."""
    write_all(private_opener(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC), data)


def append_private(path: str | Path, data: bytes) -> None:
    """`data` added at the end of the file at `path`, made 0600 (an existing one too)."""
    write_all(private_opener(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC), data)


def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the open descriptor `fd` (a write may take part of it), then close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
