"""One long-lived `sh` reading framed commands: the command protocol every host speaks.

The controller writes one line per command: the script and its stdin, each base64-encoded,
separated by a space. The remote loop runs the script in a fresh `sh` with its output captured to
files, then answers `<mark> <exit> <stdout bytes> <stderr bytes>` and the bytes. A command costs
one round trip and a few forks, against a new session for an exec channel (DESIGN.md).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from protocols.failures import Unreachable
from protocols.hosts.base import RunResult

# `base64 -d` on Linux and recent macOS, `-D` on older macOS. wc pads with spaces on BSD: unquoted.
LOOP = r"""umask 077
t=$(mktemp -d "${TMPDIR:-/tmp}/actor-run-sh.XXXXXX") || exit 1
trap 'rm -rf "$t"' EXIT
if printf 'eA==' | base64 -d >/dev/null 2>&1; then d='-d'; else d='-D'; fi
printf 'ready %s\n' "$1"
while IFS=' ' read -r s i; do
  printf '%s' "$s" | base64 $d > "$t/c"
  if [ -n "$i" ]; then printf '%s' "$i" | base64 $d > "$t/i"; else : > "$t/i"; fi
  sh "$t/c" < "$t/i" > "$t/o" 2> "$t/e"
  printf '%s %s %s %s\n' "$1" "$?" $(wc -c < "$t/o") $(wc -c < "$t/e")
  cat "$t/o" "$t/e"
done
"""


class Streams(Protocol):
    """A byte conversation with a running LOOP."""

    async def write(self, data: bytes) -> None: ...
    async def readline(self) -> bytes: ...
    async def readexactly(self, n: int) -> bytes: ...
    async def aclose(self) -> None: ...


class BufferedReceive:
    """readline/readexactly over a trio ReceiveStream."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self._stream = stream
        self._buf = bytearray()

    async def _more(self) -> None:
        chunk = await self._stream.receive_some(65536)
        if not chunk:
            raise Unreachable("the remote shell closed its output")
        self._buf += chunk

    async def readline(self) -> bytes:
        while (i := self._buf.find(b"\n")) < 0:
            await self._more()
        line = bytes(self._buf[: i + 1])
        del self._buf[: i + 1]
        return line

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            await self._more()
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data


class ShellChannel:
    """The controller's side of LOOP over any byte streams (a local pipe, an SSH channel).

    One command at a time (a lock); a command that times out or breaks the stream closes the
    channel, and the next call opens a new one through `open_streams(mark)`.
    """

    def __init__(self, open_streams: Callable[[str], Awaitable[Streams]], name: str) -> None:
        self._open_streams = open_streams
        self.name = name
        self._lock = trio.Lock()
        self._streams: Streams | None = None
        self._mark = ""
        self.commands = 0

    async def _ensure(self) -> Streams:
        if self._streams is None:
            self._mark = "ar-" + secrets.token_hex(8)
            streams = await self._open_streams(self._mark)
            first = await streams.readline()
            if first.strip() != f"ready {self._mark}".encode():
                with trio.CancelScope(shield=True):
                    await streams.aclose()
                raise Unreachable(f"{self.name}: the remote shell did not start (said {first[:200]!r})")
            self._streams = streams
        return self._streams

    async def run(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> RunResult:
        async with self._lock:
            ok = False
            try:
                with trio.fail_after(timeout):
                    streams = await self._ensure()
                    line = base64.b64encode(script.encode()) + b" " + base64.b64encode(stdin) + b"\n"
                    await streams.write(line)
                    head = await streams.readline()
                    parts = head.split()
                    if len(parts) != 4 or parts[0] != self._mark.encode():
                        raise Unreachable(f"{self.name}: unexpected answer from the remote shell: {head[:200]!r}")
                    code, n_out, n_err = (int(p) for p in parts[1:])
                    out = await streams.readexactly(n_out) if n_out else b""
                    err = await streams.readexactly(n_err) if n_err else b""
                    ok = True
                    self.commands += 1
                    return RunResult(code, out, err)
            except trio.TooSlowError as exc:
                raise Unreachable(f"{self.name}: no answer within {timeout:.0f} s") from exc
            finally:
                if not ok:
                    await self._drop()

    async def _drop(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await streams.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop()
