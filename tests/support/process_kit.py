"""Finding the processes a test's jobs left, by the folder their environment names."""

from __future__ import annotations

from pathlib import Path

import psutil


def sleeping(seconds: str, under: Path) -> list[int]:
    """Processes `sleep <seconds>` still running that a job of this test started: their environment
    names its folder (ACTOR_RUN_OUT is in the machine's sandbox), so a run of the same tests next
    door is not counted."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["cmdline"] != ["sleep", seconds] or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(str(under) in value for value in p.environ().values()):
                out.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out
