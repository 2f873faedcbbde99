"""One long-lived `sh` reading framed commands: the command protocol every host speaks.

The controller writes a header line, `<number of script lines> <stdin, base64>`, then the script's
lines. The remote loop runs the script with `eval` in a subshell (its own variables, `cd`, `set -e`
and `exit`, as in a fresh `sh`, without a new process image), its stdin from a file (or
/dev/null) and its output captured to files, then answers `<mark> <exit>`, the stdout in base64
ending at `\n<mark>-o\n`, the stderr in base64 ending at `\n<mark>-e\n`. A command with no
output costs one round trip and one fork; each non-empty stream adds one `base64` (DESIGN.md: an
exec channel costs a new session, spawning `ssh` a new connection).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

from actor_run.protocols.failures import Unreachable
from actor_run.protocols.hosts.base import RunResult

# `base64 -d` on Linux and recent macOS, `-D` on older macOS. A hangup or TERM exits through the
# EXIT trap, so the temporary folder goes with the shell. Loop variables are `_ar_*` and the
# subshell starts with no positional parameters, like a fresh `sh`. The subshell must stay a plain
# statement (not in an `if` or `&&` list), or a `set -e` in the script would be ignored.
LOOP = r"""umask 077
_ar_m=$1
_ar_t=$(mktemp -d "${TMPDIR:-/tmp}/actor-run-sh.XXXXXX") || exit 1
trap 'rm -rf "$_ar_t"' EXIT
trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM
if printf 'eA==' | base64 -d >/dev/null 2>&1; then _ar_d='-d'; else _ar_d='-D'; fi
printf 'ready %s\n' "$_ar_m"
while IFS=' ' read -r _ar_n _ar_i; do
  _ar_c=
  while [ "$_ar_n" -gt 0 ] && IFS= read -r _ar_l; do
    _ar_c="$_ar_c$_ar_l
"
    _ar_n=$((_ar_n - 1))
  done
  if [ -n "$_ar_i" ]; then
    base64 $_ar_d > "$_ar_t/i" <<_AR_EOF
$_ar_i
_AR_EOF
    ( set --; eval "$_ar_c" ) < "$_ar_t/i" > "$_ar_t/o" 2> "$_ar_t/e"
  else
    ( set --; eval "$_ar_c" ) < /dev/null > "$_ar_t/o" 2> "$_ar_t/e"
  fi
  _ar_r=$?
  printf '%s %s\n' "$_ar_m" "$_ar_r"
  if [ -s "$_ar_t/o" ]; then base64 < "$_ar_t/o"; fi
  printf '\n%s-o\n' "$_ar_m"
  if [ -s "$_ar_t/e" ]; then base64 < "$_ar_t/e"; fi
  printf '\n%s-e\n' "$_ar_m"
done
"""


def encode_command(script: str, stdin: bytes) -> bytes:
    """The bytes the controller writes for one command (see the module docstring)."""
    body = script.encode()
    if b"\0" in body:
        raise ValueError("a script cannot contain a NUL byte")
    if body and not body.endswith(b"\n"):
        body += b"\n"
    return b"%d %s\n" % (body.count(b"\n"), base64.b64encode(stdin)) + body


class Streams(Protocol):
    """A byte conversation with a running LOOP. A stream may also offer `readuntil(separator)`
    (as BufferedReceive does): the bytes before the separator, which is consumed; ShellChannel
    then reads a long output in one call instead of a line at a time."""

    async def write(self, data: bytes) -> None: ...
    async def readline(self) -> bytes: ...
    async def readexactly(self, n: int) -> bytes: ...
    async def aclose(self) -> None: ...


class Receives(Protocol):
    """What BufferedReceive reads from: a trio ReceiveStream, or anything with its `receive_some`."""

    async def receive_some(self, max_bytes: int, /) -> bytes | bytearray: ...


class BufferedReceive:
    """readline/readexactly/readuntil over a trio ReceiveStream (or anything with `receive_some`)."""

    def __init__(self, stream: Receives) -> None:
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

    async def readuntil(self, separator: bytes) -> bytes:
        start = 0
        while (i := self._buf.find(separator, start)) < 0:
            start = max(0, len(self._buf) - len(separator) + 1)  # never scan the same bytes twice
            await self._more()
        data = bytes(self._buf[:i])
        del self._buf[: i + len(separator)]
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
                    await streams.write(encode_command(script, stdin))
                    head = await streams.readline()
                    parts = head.split()
                    if len(parts) != 2 or parts[0] != self._mark.encode() or not parts[1].isdigit():
                        raise Unreachable(f"{self.name}: unexpected answer from the remote shell: "
                                          f"{head[:200]!r}")
                    code = int(parts[1])
                    out = await self._read_base64(streams, b"-o")
                    err = await self._read_base64(streams, b"-e")
                    ok = True
                    self.commands += 1
                    return RunResult(code, out, err)
            except trio.TooSlowError as exc:
                raise Unreachable(f"{self.name}: no answer within {timeout:.0f} s") from exc
            finally:
                if not ok:
                    await self._drop()

    async def _read_base64(self, streams: Streams, end: bytes) -> bytes:
        end_line = self._mark.encode() + end + b"\n"
        readuntil = getattr(streams, "readuntil", None)
        if readuntil is not None:
            data: bytes = await readuntil(b"\n" + end_line)
            return base64.b64decode(data)  # newlines are skipped
        lines = []
        while (line := await streams.readline()) != end_line:
            lines.append(line)
        return base64.b64decode(b"".join(lines))

    async def _drop(self) -> None:
        streams, self._streams = self._streams, None
        if streams is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await streams.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop()
