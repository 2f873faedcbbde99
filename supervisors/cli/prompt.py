"""A question on the terminal that a Ctrl-C always ends (`ask_line`), for `run`'s `[y/N]`."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys


def ask_line(question: str) -> str:
    """Write `question` to stdout and read one line from stdin (a terminal), without its newline;
    EOFError when stdin ends first. A Ctrl-C raises KeyboardInterrupt whenever it comes. Not
    `input()`: on a terminal readline prints the question and only then waits in select(), and a
    SIGINT in between is handled with nobody to see it, so the question waits for a line forever
    (3 times in 8 on a loaded machine). Here the signal also writes a byte into a pipe the wait
    watches (`signal.set_wakeup_fd`), so the wait ends and Python's handler raises. Main thread only."""
    fd = sys.stdin.fileno()
    sys.stdout.write(question)
    sys.stdout.flush()
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    before = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    try:
        got = b""
        while b"\n" not in got:
            ready, _, _ = select.select([fd, woken], [], [])
            if woken in ready:  # a signal whose handler did not raise (a resize): wait on
                with contextlib.suppress(BlockingIOError):
                    os.read(woken, 512)
            if fd in ready:
                chunk = os.read(fd, 1024)
                if not chunk:
                    if got:
                        break
                    raise EOFError
                got += chunk
        return got.split(b"\n", 1)[0].decode(errors="replace")
    finally:
        signal.set_wakeup_fd(before)
        os.close(woken)
        os.close(wake)


__all__ = ["ask_line"]
