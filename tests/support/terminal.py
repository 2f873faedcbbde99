"""`actor-run` on a pseudo-terminal, as a user's terminal runs it: the pty is its stdout (and its
stderr and stdin unless told), a thread of the test's own keeps all it writes (so a child writing
much never waits on the test), and the test waits on what it wrote, bounded.

    with Terminal([*CLI, "run", str(batch)], env=ENV) as term:
        term.wait_for("[y/N]", 120)
        term.write(b"n\\n")              # or term.proc.send_signal(signal.SIGINT)
        code = term.wait(120)
    term.text()                          # all it wrote, escape sequences and \\r\\n as they came
"""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType


class Terminal:
    """A child on a pseudo-terminal of `rows` x `cols` (0 x 0: a size never set). `stdin`: the pty
    (True) or nothing (False: /dev/null); `stderr`: the pty (True) or a pipe (False: `self.proc.stderr`,
    bytes); `controlling`: the pty is the child's controlling terminal (`setsid -c`: a Ctrl-C typed
    there is SIGINT), else the child runs in a session of its own without one."""

    def __init__(self, args: list[str], *, env: dict[str, str], cwd: Path | None = None, rows: int = 0,
                 cols: int = 0, stdin: bool = True, stderr: bool = True, controlling: bool = False) -> None:
        self.main, side = pty.openpty()
        if rows or cols:
            fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.raw = bytearray()
        self.changed = threading.Condition()
        try:
            self.proc = subprocess.Popen(
                ["setsid", "-c", *args] if controlling else args, stdin=side if stdin else subprocess.DEVNULL,
                stdout=side, stderr=side if stderr else subprocess.PIPE, env=env, cwd=cwd,
                start_new_session=not controlling)
        except BaseException:
            os.close(self.main)
            raise
        finally:
            os.close(side)
        self.thread = threading.Thread(target=self._read, name="test-pty", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.main, 65536)
            except OSError:  # every holder of the other side closed it: EIO on Linux
                data = b""
            with self.changed:
                self.raw += data
                self.changed.notify_all()
            if not data:
                return

    def text(self) -> str:
        """All it wrote so far, decoded (a broken sequence replaced)."""
        with self.changed:
            return self.raw.decode(errors="replace")

    def wait_for(self, check: str | Callable[[str], bool], timeout: float, what: str = "") -> None:
        """Return once what it wrote holds `check` (a text, or a test of all the text); AssertionError
        (with the end of what it wrote) after `timeout` s."""
        test = (lambda text: check in text) if isinstance(check, str) else check
        end = time.monotonic() + timeout
        with self.changed:
            while not test(self.raw.decode(errors="replace")):
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what or check!r}; it wrote: {self.raw[-3000:]!r}")
                self.changed.wait(left)

    def write(self, data: bytes) -> None:
        """Type `data` on its terminal."""
        os.write(self.main, data)

    def wait(self, timeout: float) -> int:
        """Its exit code once it has ended and all it wrote is read (bounded: `timeout` s each)."""
        code = self.proc.wait(timeout)
        self.thread.join(timeout)
        return code

    def close(self) -> None:
        """Kill it if it still runs, stop the reader, close the pty (and the stderr pipe)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        self.thread.join(10)
        os.close(self.main)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
