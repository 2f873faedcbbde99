"""An owner (a controller) as the ledger has it, and whether it is alive: what a reader needs of
owners, without the writer's machinery (machines.py records them)."""

from __future__ import annotations

import socket

import msgspec
import psutil


def process_start_time(pid: int) -> float | None:
    """When the process `pid` started; None if there is none, or only its zombie (it exited and
    its parent has not reaped it: under a PID 1 that reaps nothing, a container's, a dead
    controller stays one for good, and must not count as alive)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(process.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class OwnerRow(msgspec.Struct, frozen=True):
    id: str
    pid: int
    started: float
    host: str
    beat: float
    closed: int
    lease_until: float | None = None


def owner_is_alive(row: OwnerRow, *, now: float, stale_after_s: float = 600.0) -> bool:
    """Fail closed: an owner counts as alive unless we can tell it is gone. On this computer, by
    its pid and that process's start time (a reused pid is another process); elsewhere, by a
    heartbeat older than `stale_after_s`."""
    if row.closed:
        return False
    if row.host == socket.gethostname():
        started = process_start_time(row.pid)
        if started is None:
            return False
        return abs(started - row.started) < 2.0
    return now - row.beat < stale_after_s
