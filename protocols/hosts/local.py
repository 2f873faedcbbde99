"""The host of a machine on this computer: a persistent local `sh` speaking the same command
protocol as the SSH host (hosts/shell.py), and plain file copies."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import trio

from actor_run.protocols.failures import Unreachable
from actor_run.protocols.hosts.base import RunResult
from actor_run.protocols.hosts.shell import LOOP, BufferedReceive, ShellChannel
from actor_run.protocols.offload import to_thread
from actor_run.protocols.processes import Process, open_process, run_process


class _ProcessStreams:
    def __init__(self, proc: Process) -> None:
        assert proc.stdin is not None
        assert proc.stdout is not None
        self._proc = proc
        self._stdin = proc.stdin
        self._reader = BufferedReceive(proc.stdout)

    async def write(self, data: bytes) -> None:
        try:
            await self._stdin.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise Unreachable("the local shell is gone") from exc

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._stdin.aclose()
            with trio.move_on_after(2):
                await self._proc.wait()
            if self._proc.returncode is None:
                self._proc.kill()
                await self._proc.wait()
            assert self._proc.stdout is not None
            await self._proc.stdout.aclose()


# what a shell on this computer (and so a job of the `local` cloud) keeps of the controller's
# environment: a shell's basics. Never the rest: the controller holds provider keys, PGPASSWORD, a
# ledger URL, and a job that runs `env` printed them into its log.txt. The job's own variables are
# the batch's `env` (scripts.py writes them beside the command)
KEPT_ENVIRON = ("HOME", "LANG", "LANGUAGE", "LOGNAME", "PATH", "SHELL", "TERM", "TMPDIR", "TZ", "USER")


def job_environ() -> dict[str, str]:
    """The environment of a local shell: `KEPT_ENVIRON` and the locale's `LC_*` from this process."""
    return {k: v for k, v in os.environ.items() if k in KEPT_ENVIRON or k.startswith("LC_")}


def _copy(local: Path, remote: Path) -> int:
    if local.is_dir():
        shutil.copytree(local, remote, symlinks=True)
        return sum(p.stat().st_size for p in remote.rglob("*") if p.is_file() and not p.is_symlink())
    remote.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(local, remote)
    return remote.stat().st_size


class LocalHost:
    """A machine that is a folder on this computer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._channel = ShellChannel(self._open, name)

    async def _open(self, mark: str) -> _ProcessStreams:
        # its own session: a Ctrl-C at the terminal must not take the shell the cleanup needs
        proc = await open_process(
            ["sh", "-c", LOOP, "actor-run-sh", mark],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, env=job_environ(),
        )
        return _ProcessStreams(proc)

    async def run(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> RunResult:
        return await self._channel.run(script, stdin=stdin, timeout=timeout)

    async def put(self, local: Path, remote: str) -> int:
        return await to_thread(_copy, local, Path(remote))

    async def wait_exit(self, pid: int) -> None:
        """Return once process `pid` has ended (a pidfd turns readable; where Linux has none, never)."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return  # ended already
        except (AttributeError, OSError):  # not Linux, or a kernel before 5.3: the polls see it
            await trio.sleep_forever()
            return
        try:
            await trio.lowlevel.wait_readable(fd)
        finally:
            os.close(fd)

    async def get_tar(self, remote_dir: str, names: list[str], local_tar: Path) -> int:
        with open(local_tar, "wb") as f:  # noqa: ASYNC230 - tar writes it, not us
            proc = await run_process(
                ["tar", "-cf", "-", "-C", remote_dir, *names], stdout=f, capture_stderr=True, start_new_session=True,
            )
        if proc.returncode != 0:
            raise Unreachable(f"tar of {names} in {remote_dir} failed: {proc.stderr.decode(errors='replace')[-300:]}")
        return os.path.getsize(local_tar)  # noqa: ASYNC240 - one stat: a thread hop costs more

    async def aclose(self) -> None:
        await self._channel.aclose()
