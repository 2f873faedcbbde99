"""Child processes for trio code, started on our own offload threads (protocols/offload.py).

trio's `open_process` and `run_process` call `subprocess.Popen` on one of trio's cached worker
threads, which outlive their last use by about 10 s, process-wide: a Runner closed by an
embedding host left one behind. These do the same on an `OFFLOAD` thread (ended when the last
reactor stops), with the same shapes for what the hosts and the sky CLI use: pipes as trio
`FdStream`s, `wait()` on a pidfd (Linux; elsewhere a short poll), `run_process` capturing output,
feeding bytes to stdin and, when cancelled, calling `deliver_cancel` (default: kill) and waiting
for the child before the cancellation goes on.

Threads: every coroutine here runs on the calling trio thread; only `Popen` itself runs on an
offload thread.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from actor_run.protocols.offload import to_thread

POLL_S = 0.02  # where there is no pidfd: how often `wait` looks


class Process:
    """A started child: `pid`, `returncode` (None while it runs), `stdin`/`stdout`/`stderr` (trio
    streams where a pipe was asked for, else None)."""

    def __init__(self, popen: subprocess.Popen[bytes], stdin: trio.lowlevel.FdStream | None,
                 stdout: trio.lowlevel.FdStream | None, stderr: trio.lowlevel.FdStream | None) -> None:
        self._popen = popen
        self.pid = popen.pid
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self._pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):  # not Linux, a kernel before 5.3, reaped already
            self._pidfd = os.pidfd_open(popen.pid)

    @property
    def returncode(self) -> int | None:
        if self._popen.returncode is None:
            self._popen.poll()
        return self._popen.returncode

    async def wait(self) -> int:
        """Wait until the child has exited (and reap it); its exit status."""
        while self.returncode is None:
            if self._pidfd is not None:
                await trio.lowlevel.wait_readable(self._pidfd)
                self._popen.wait()  # readable: it has exited, the reap does not block
            else:
                await trio.sleep(POLL_S)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        code = self._popen.returncode
        assert code is not None
        return code

    def kill(self) -> None:
        if self.returncode is None:
            self._popen.kill()

    def terminate(self) -> None:
        if self.returncode is None:
            self._popen.terminate()


def _pipe(child_reads: bool) -> tuple[trio.lowlevel.FdStream, int]:
    """(our end as a trio stream, the child's end); both are closed on exec in any other child."""
    r, w = os.pipe()
    return (trio.lowlevel.FdStream(w), r) if child_reads else (trio.lowlevel.FdStream(r), w)


def _popen(command: list[str], std: list[Any], options: dict[str, Any]) -> subprocess.Popen[bytes]:
    popen: subprocess.Popen[bytes] = subprocess.Popen(command, stdin=std[0], stdout=std[1], stderr=std[2], **options)
    return popen


async def open_process(command: Sequence[str], *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
                       **options: Any) -> Process:
    """Start `command` (`subprocess.Popen`'s arguments; PIPE makes a trio stream of that end)."""
    ours: list[trio.lowlevel.FdStream | None] = [None, None, None]
    theirs: list[int] = []
    args = [stdin, stdout, stderr]
    try:
        for i, given in enumerate(args):
            if given == subprocess.PIPE:
                ours[i], args[i] = _pipe(child_reads=i == 0)
                theirs.append(args[i])
        popen = await to_thread(_popen, list(command), args, options)
    except BaseException:
        for stream in ours:
            if stream is not None:
                stream.close()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return Process(popen, *ours)


async def _kill(proc: Process) -> None:
    proc.kill()


async def run_process(
    command: Sequence[str], *, stdin: bytes | Any = b"", capture_stdout: bool = False, capture_stderr: bool = False,
    stdout: Any = None, stderr: Any = None, deliver_cancel: Callable[[Process], Awaitable[None]] | None = None,
    **options: Any,
) -> subprocess.CompletedProcess[bytes]:
    """Run `command` to its end: `stdin` bytes are fed to it (or a file/fd is given to it), output
    captured where asked. Never raises for an exit status (read `returncode`). Cancelled, it calls
    `deliver_cancel(proc)` (default: kill) and waits for the child, then lets the cancellation go on."""
    feed = stdin if isinstance(stdin, bytes | bytearray) else None
    proc = await open_process(
        command, stdin=subprocess.PIPE if feed is not None else stdin,
        stdout=subprocess.PIPE if capture_stdout else stdout, stderr=subprocess.PIPE if capture_stderr else stderr,
        **options,
    )
    out, err = bytearray(), bytearray()

    async def send() -> None:
        assert proc.stdin is not None
        async with proc.stdin:
            with contextlib.suppress(trio.BrokenResourceError):  # it exited without reading all
                if feed:
                    await proc.stdin.send_all(feed)

    async def read(stream: trio.lowlevel.FdStream, into: bytearray) -> None:
        async with stream:
            while chunk := await stream.receive_some():
                into += chunk

    try:
        async with trio.open_nursery() as nursery:
            if proc.stdin is not None:
                nursery.start_soon(send)
            if proc.stdout is not None:
                nursery.start_soon(read, proc.stdout, out)
            if proc.stderr is not None:
                nursery.start_soon(read, proc.stderr, err)
            await proc.wait()
    except BaseException:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(deliver_cancel or _kill, proc)
                    await proc.wait()
                    nursery.cancel_scope.cancel()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        raise
    code = proc.returncode
    assert code is not None
    return subprocess.CompletedProcess(list(command), code, bytes(out), bytes(err))


__all__ = ["Process", "open_process", "run_process"]
