"""The Host protocol: how to talk to one machine.

A host runs POSIX sh scripts (one long-lived remote `sh` per machine, so a command costs a round
trip, not a session), sends a file or folder there, and streams a tar of some of its files back.
Every method is a trio coroutine that runs on the reactor. Failures raise `Unreachable` (the
machine could not be reached: wait and retry) or `Refused` (it answered no).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import msgspec


class RunResult(msgspec.Struct, frozen=True):
    exit_code: int
    stdout: bytes
    stderr: bytes

    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def error_text(self) -> str:
        return self.stderr.decode(errors="replace").strip()[-500:]


class Host(Protocol):
    name: str

    async def run(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> RunResult:
        """Run a POSIX sh script; its exit code, stdout and stderr."""
        ...

    async def put(self, local: Path, remote: str) -> int:
        """Copy a file or folder (links kept as links) to `remote`, which must not exist; bytes sent."""
        ...

    async def get_tar(self, remote_dir: str, names: list[str], local_tar: Path) -> int:
        """A tar (links as links, never followed) of `names` under `remote_dir`, into `local_tar`; bytes received."""
        ...

    async def aclose(self) -> None:
        ...
