"""The children a test starts and what they leave: a child's output read line by line (`Output`),
a batch whose jobs sleep (`sleeper`), and the processes a test's jobs left (`sleeping`)."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import IO

import psutil


class Output:
    """A child's stream (a text pipe), line by line, read by a thread of the test's own (so a child
    writing much never waits on the test)."""

    def __init__(self, stream: IO[str]) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), name="test-output", daemon=True)
        self.thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.q.put(line)

    def wait_for(self, text: str, timeout: float = 30.0) -> None:
        """Return once a line said so far holds `text`; AssertionError (with all it said) after `timeout` s."""
        end = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            try:
                self.seen.append(self.q.get(timeout=max(0.0, end - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"{text!r} not said; said: {''.join(self.seen)}") from None

    def rest(self) -> str:
        """All it said, once the stream has ended (the child exited; bounded: 30 s)."""
        self.thread.join(30)
        while not self.q.empty():
            self.seen.append(self.q.get_nowait())
        return "".join(self.seen)


def sleeper(seconds: str) -> str:
    """A batch file of two seeds whose jobs sleep `seconds` on the sim cloud (a machine's delete takes
    0.5 s): `seconds` is each test's own, so `sleeping(seconds, ...)` finds its jobs and no other's."""
    return f"""\
[job]
name = "long"
command = "sleep {seconds}"
seeds = [1, 2]

[policy]
poll_s = 0.1
setup_grace_s = 60

[[candidates]]
cloud = "sim"
gpu = "A100"

[clouds.sim]
launch_latency_s = 0.01
delete_latency_s = 0.5
"""


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
