"""The host of a machine reached over SSH: asyncssh, on the asyncio loop beside the reactor (hosts/aio.py).

One connection per machine, opened on first use and replaced on the next call after it broke.
Commands go through one long-lived remote `sh` on one session channel (the LOOP of
hosts/shell.py: a round trip per command, not a session); `put` and `get_tar` stream on exec
channels of their own (a file as its bytes, a folder as a tar), so a long transfer never holds up
a heartbeat. An upload of `bulk_bytes` or more goes through the OpenSSH client instead, held to
the same pinned key: asyncssh's pure-Python packet path tops out below `rsync -e ssh`, OpenSSH's
C does not (bench/transfer.py). If that client fails, the upload is redone through asyncssh.

Trust: the host key is pinned at the first successful login (handshake and our key accepted;
never before: a booting guest may show a key it replaces a moment later) into our own
known-hosts file (OpenSSH format, so `ssh -o UserKnownHostsFile=<it>` agrees) and held to
afterwards: a different key at the same address and port raises `Refused(GUARD)`, never a
silent accept. No agent forwarding, no port forwarding. The client key is the configured one,
else whatever asyncssh finds (agent, ~/.ssh). No key material is ever logged; fingerprints are.

Every method is a trio coroutine. asyncssh's objects live on one asyncio loop (the reactor's, or
`open_asyncio_loop()`'s: the current one at the first call, or the one given) and are touched only
there: each asyncssh call is sent to that loop and awaited (`AsyncioLoop.run`); a trio
cancellation cancels it there. Outside any loop a call raises `ReactorError`.
Failures: `Unreachable` (refused, reset, timed out, lost: the caller waits and retries; the next
call reconnects), `Refused(GUARD)` (the host key changed), `Refused(LAUNCH_FAILED)` (our keys
were not accepted).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager, suppress
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

import asyncssh
import trio

from actor_run.protocols.failures import CallCancelled, Code, Refused, Unreachable
from actor_run.protocols.hosts.aio import AsyncioLoop, current_asyncio_loop
from actor_run.protocols.hosts.base import RunResult
from actor_run.protocols.hosts.content import tree_size
from actor_run.protocols.hosts.host_keys import HostKeys, PinningClient
from actor_run.protocols.hosts.shell import LOOP, BufferedReceive, ShellChannel
from actor_run.protocols.logs import logger
from actor_run.protocols.offload import to_thread
from actor_run.protocols.processes import Process, open_process, run_process

T = TypeVar("T")

# AES-GCM first: asyncssh moves bulk data faster with it than with chacha20 (bench/transfer.py).
CIPHERS = [
    "aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
    "aes128-ctr", "aes192-ctr", "aes256-ctr",
]
CHUNK = 1 << 20  # bytes per read of a local file and per write to a channel
RECEIVE = 1 << 18  # bytes asked of a channel per read
WINDOW = 8 << 20  # receive window of our channels
KEEPALIVE_S = 10.0  # a silent peer is declared lost after KEEPALIVE_S x KEEPALIVE_COUNT
KEEPALIVE_COUNT = 3
BULK_BYTES = 64 << 20  # from this size on, an upload goes through the OpenSSH client (when found)
SSH_CLIENT = "ssh"  # found on PATH as a host is made (PATH may change between runs of one process)

# what a broken, refused or vanished connection raises inside asyncssh and asyncio
_LOST = (OSError, EOFError, asyncio.IncompleteReadError, asyncssh.Error)


class _NotSent(Unreachable):
    """The shell channel was found closed before the command left: sending it again is safe."""


class _ChannelStreams:
    """The `Streams` of hosts/shell.py over an asyncssh process, buffered on the trio side so
    that a line costs no trip into asyncio once its bytes are here."""

    def __init__(self, host: SSHHost, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self._host = host
        self._proc = proc
        self._reader = BufferedReceive(self)

    async def receive_some(self, max_bytes: int) -> bytes:
        chunk: bytes = await self._host._call(self._proc.stdout.read, max(max_bytes, RECEIVE))
        return chunk

    async def write(self, data: bytes) -> None:
        async def send() -> None:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()

        if self._proc.stdin.is_closing():
            raise _NotSent(f"{self._host.name}: the shell channel had closed")
        try:
            await self._host._call(send)
        except Unreachable as exc:
            if isinstance(exc.__cause__, BrokenPipeError):  # refused before a byte was queued
                raise _NotSent(str(exc)) from exc.__cause__
            raise

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)

    async def readuntil(self, separator: bytes) -> bytes:
        return await self._reader.readuntil(separator)

    async def aclose(self) -> None:
        async def close() -> None:
            self._proc.close()
            await self._proc.wait_closed()

        with trio.CancelScope(shield=True):
            with trio.move_on_after(2) as scope, suppress(Unreachable):  # gone with its connection
                await self._host._call(close)
            if scope.cancelled_caught:  # the channel does not answer: neither will the connection
                await self._host._forget()


class SSHHost:
    """A machine at `user@address:port`, trusted by the key pinned in `known_hosts`."""

    def __init__(
        self, name: str, address: str, *, known_hosts: Path, port: int = 22, user: str = "",
        key: str | None = None, passphrase: str | None = None, connect_timeout_s: float = 10.0,
        loop: AsyncioLoop | None = None,
        bulk_bytes: int = BULK_BYTES, ssh_client: str | None = SSH_CLIENT,
    ) -> None:
        self.name = name
        self.address = address
        self.port = port
        self.user = user
        self.key = str(Path(key).expanduser()) if key else None
        self.keys = HostKeys(Path(known_hosts).expanduser())
        self.connect_timeout_s = connect_timeout_s
        self._loop = loop
        self.bulk_bytes = bulk_bytes  # uploads from this size on go through `ssh_client` (None: never)
        # an encrypted key is unlocked by asyncssh alone: OpenSSH's client would ask for the passphrase
        self.ssh_client = None if passphrase or not ssh_client else shutil.which(ssh_client)
        self._passphrase = passphrase
        self._conn: asyncssh.SSHClientConnection | None = None
        self._conn_lock = trio.Lock()
        self._channel = ShellChannel(self._open_shell, name)
        self.connects = 0  # connections opened so far (a reconnect adds one)
        self._log = logger.bind(host=name)

    # --- the connection ---------------------------------------------------------------------------

    def _aio(self) -> AsyncioLoop:
        # the loop of the first call is kept: a connection lives on one loop, and a later call that
        # came through trio.from_thread.run does not see the loop in its context
        if self._loop is None or not self._loop.running:
            self._loop = current_asyncio_loop()
        return self._loop

    async def _call(self, fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """An asyncssh coroutine from trio; a lost connection raises Unreachable and is dropped."""
        try:
            return await self._aio().run(fn, *args, **kwargs)
        except _LOST as exc:
            conn = self._conn
            if conn is not None and conn.is_closed():
                self._conn = None
            raise Unreachable(f"{self.name}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._conn_lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            await self._forget()
            client = PinningClient(self.keys, self.address, self.port)
            options: dict[str, Any] = dict(
                known_hosts=lambda host, addr, port: (self.keys.trusted(self.address, self.port), [], []),
                client_factory=lambda: client,
                agent_forwarding=False,
                x11_forwarding=False,
                connect_timeout=self.connect_timeout_s,
                keepalive_interval=KEEPALIVE_S,
                keepalive_count_max=KEEPALIVE_COUNT,
                encryption_algs=CIPHERS,
                compression_algs=None,
            )
            if self.user:
                options["username"] = self.user
            if self.key:
                options["client_keys"] = [self.key]
                if self._passphrase:
                    options["passphrase"] = self._passphrase
            where = f"{self.user + '@' if self.user else ''}{self.address}:{self.port}"
            try:
                with trio.fail_after(self.connect_timeout_s + 5):
                    conn: asyncssh.SSHClientConnection = await self._aio().run(
                        asyncssh.connect, self.address, self.port, **options
                    )
            except trio.TooSlowError as exc:
                raise Unreachable(
                    f"{self.name}: no SSH session with {where} within {self.connect_timeout_s:.0f} s"
                ) from exc
            except asyncssh.HostKeyNotVerifiable as exc:
                if client.changed_to:
                    raise Refused(
                        Code.GUARD,
                        f"host key of {self.address}:{self.port} changed (it now shows {client.changed_to}, "
                        f"not the key pinned in {self.keys.path}): refusing to connect",
                    ) from exc
                raise Unreachable(f"{self.name}: host key of {where} not verifiable: {exc}") from exc
            except asyncssh.PermissionDenied as exc:
                raise Refused(Code.LAUNCH_FAILED, f"{self.name}: {where} did not accept our key(s)") from exc
            except _LOST as exc:
                raise Unreachable(f"{self.name}: cannot reach {where}: {type(exc).__name__}: {exc}") from exc
            if client.seen is not None:  # the first login: its key is the one held to from now on
                if not self.keys.pin(self.address, self.port, client.seen):
                    self._abort(conn)  # another connection pinned a different key meanwhile
                    raise Refused(Code.GUARD, f"host key of {self.address}:{self.port} changed while logging in "
                                              f"(not the key pinned in {self.keys.path}): refusing to connect")
                logger.info("ssh: pinned the host key of {}:{} ({})", self.address, self.port,
                            client.seen.get_fingerprint())
            self._conn = conn
            self.connects += 1
            self._log.debug("ssh: connected to {}", where)
            return conn

    async def _forget(self) -> None:
        """Drop the connection (abort: a dead peer must not hold us up)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._abort(conn)

    def _abort(self, conn: asyncssh.SSHClientConnection) -> None:
        """`conn.abort()` on its loop's thread (asyncssh is not thread-safe); gone with a stopped loop."""
        loop = self._loop
        if loop is not None:
            with suppress(CallCancelled):
                loop.soon(conn.abort)

    @asynccontextmanager
    async def _opening(self, what: str) -> AsyncIterator[None]:
        """A channel that does not open in time means a dead connection: drop it."""
        try:
            with trio.fail_after(self.connect_timeout_s + 5):
                yield
        except trio.TooSlowError as exc:
            await self._forget()
            raise Unreachable(
                f"{self.name}: no {what} channel within {self.connect_timeout_s + 5:.0f} s"
            ) from exc

    async def _open_process(self, what: str, command: str, **kwargs: Any) -> asyncssh.SSHClientProcess[bytes]:
        async with self._opening(what):
            conn = await self._connection()
            proc: asyncssh.SSHClientProcess[bytes] = await self._call(
                conn.create_process, command, encoding=None, window=WINDOW, **kwargs
            )
        return proc

    @asynccontextmanager
    async def _process(
        self, what: str, command: str, **kwargs: Any,
    ) -> AsyncIterator[asyncssh.SSHClientProcess[bytes]]:
        """An exec channel running `command` (bytes in and out), closed on the way out."""
        proc = await self._open_process(what, command, **kwargs)
        try:
            yield proc
        finally:
            async def close() -> None:
                proc.close()
                await proc.wait_closed()

            with trio.CancelScope(shield=True), trio.move_on_after(5), suppress(Unreachable):  # gone with it
                await self._call(close)

    async def _open_shell(self, mark: str) -> _ChannelStreams:
        command = shlex.join(["sh", "-c", LOOP, "actor-run-sh", mark])
        return _ChannelStreams(self, await self._open_process("shell", command, stderr=asyncssh.DEVNULL))

    # --- the Host protocol ------------------------------------------------------------------------

    async def run(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> RunResult:
        try:
            return await self._channel.run(script, stdin=stdin, timeout=timeout)
        except _NotSent:  # the connection broke while idle: the command goes on a new one
            return await self._channel.run(script, stdin=stdin, timeout=timeout)

    async def put(self, local: Path, remote: str) -> int:
        """A file goes as its bytes, anything else as a tar stream (links kept as links). A big one
        goes through the OpenSSH client when there is one: C moves bytes faster than asyncssh."""
        mode = (await to_thread(os.lstat, local)).st_mode
        r, parent = shlex.quote(remote), shlex.quote(remote.rsplit("/", 1)[0] or "/")
        # umask: the root is private and so is everything under it; tar as root keeps modes, not owners
        script = (
            f"umask 077; mkdir -p {parent} || exit 1\n"
            f"if [ -e {r} ] || [ -L {r} ]; then\n"
            f"  echo {shlex.quote(remote + ' already exists')} >&2; exit 1\nfi\n"
        )
        untar = "tar -xf - --no-same-owner -C"
        tar: list[str] | None = None  # the local tar that makes the stream, None for a file's bytes
        size: int
        if stat.S_ISREG(mode):
            script += f"cat > {r}" + (f" && chmod u+x {r}\n" if mode & stat.S_IXUSR else "\n")
            size = (await to_thread(os.stat, local)).st_size
        elif stat.S_ISDIR(mode):
            script += f"mkdir {r} && {untar} {r}\n"
            tar, size = ["-C", str(local), "."], await to_thread(tree_size, local)
        elif local.name == remote.rsplit("/", 1)[-1]:
            script += f"{untar} {parent}\n"
            tar, size = ["-C", str(local.parent), local.name], 0
        else:
            raise ValueError(f"a link is sent under its own name, not as {remote}")
        await self._connection()  # pins the host key before the OpenSSH client is asked to hold to it
        bulk = self.ssh_client and size >= self.bulk_bytes
        if bulk and await self._send_by_ssh_client(script, remote, local, tar):
            return size
        chunks = _file_chunks(local) if tar is None else _tar_chunks(tar)
        await self._send(script, chunks)
        return size

    async def _send(self, script: str, chunks: AsyncGenerator[bytes, None]) -> None:
        async with self._process("upload", shlex.join(["sh", "-c", script]), stderr=asyncssh.PIPE) as proc:
            async def send(data: bytes) -> None:
                proc.stdin.write(data)
                await proc.stdin.drain()

            async def finish() -> tuple[int | None, bytes]:
                if not proc.stdin.is_closing():
                    proc.stdin.write_eof()
                done = await proc.wait()  # reads what is left of stderr
                return done.exit_status, done.stderr if isinstance(done.stderr, bytes) else b""

            try:
                async with aclosing(chunks) as it:
                    async for chunk in it:
                        await self._call(send, chunk)
            except Unreachable as exc:
                why = b""
                with trio.move_on_after(5), suppress(Unreachable):  # the remote side may say why it stopped
                    why = (await self._call(finish))[1]
                if why:
                    raise Unreachable(f"{self.name}: upload stopped: {_tail(why)}") from exc
                raise
            status, err = await self._call(finish)
        if status != 0:
            raise Unreachable(f"{self.name}: upload exited {status}: {_tail(err)}")

    def ssh_client_args(self) -> list[str]:
        """The OpenSSH client's options and destination, held to the same trust as our connection."""
        pinned = self.keys.trusted(self.address, self.port)
        algs = sorted({a.decode() for k in pinned for a in k.sig_algorithms})
        args = [
            self.ssh_client or "ssh", "-T", "-p", str(self.port),
            "-o", f"UserKnownHostsFile={self.keys.path}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no",
            "-o", "BatchMode=yes", "-o", "ForwardAgent=no", "-o", "ForwardX11=no",
            "-o", "ClearAllForwardings=yes", "-o", "ControlPath=none", "-o", "PermitLocalCommand=no",
            "-o", f"ConnectTimeout={max(1, int(self.connect_timeout_s))}",
            "-o", f"Ciphers={','.join(CIPHERS)}",
            "-o", f"ServerAliveInterval={int(KEEPALIVE_S)}", "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}",
            "-o", "LogLevel=ERROR",
        ]
        if algs:
            args += ["-o", f"HostKeyAlgorithms={','.join(algs)}"]
        if self.key:
            args += ["-i", self.key, "-o", "IdentitiesOnly=yes"]
        if self.user:
            args += ["-l", self.user]
        return [*args, self.address]

    async def _send_by_ssh_client(
        self, script: str, remote: str, local: Path, tar: list[str] | None,
    ) -> bool:
        """Stream through `ssh`; False (and nothing left behind) if ssh itself failed."""
        command = [*self.ssh_client_args(), shlex.join(["sh", "-c", script])]
        with tempfile.TemporaryFile() as err:
            if tar is None:
                with open(local, "rb") as source:  # noqa: ASYNC230 - ssh reads it, not us
                    done = await run_process(
                        command, stdin=source, stdout=subprocess.DEVNULL, stderr=err,
                    )
                code = int(done.returncode)
            else:
                code = await _piped([_tar_args(tar), command], err)
            err.seek(0)
            why = err.read(4000)
        if code == 0:
            return True
        if code != 255:  # the remote script said no
            raise Unreachable(f"{self.name}: upload exited {code}: {_tail(why)}")
        self._log.warning("ssh: the OpenSSH client failed ({}); sending through asyncssh", _tail(why))
        res = await self.run(f"rm -rf -- {shlex.quote(remote)}", timeout=60)
        if res.exit_code != 0:
            raise Unreachable(f"{self.name}: could not remove a partial upload: {res.error_text()}")
        return False

    async def get_tar(self, remote_dir: str, names: list[str], local_tar: Path) -> int:
        command = shlex.join(["tar", "-cf", "-", "-C", remote_dir, *names])
        received = 0
        async with self._process("download", command, stdin=asyncssh.DEVNULL, stderr=asyncssh.PIPE) as proc:
            f = await to_thread(_open_binary, local_tar, "wb")
            try:
                while chunk := await self._call(proc.stdout.read, RECEIVE):
                    await to_thread(f.write, chunk)
                    received += len(chunk)
            finally:
                f.close()

            async def finish() -> tuple[int | None, bytes]:
                done = await proc.wait()  # reads what is left of stderr
                return done.exit_status, done.stderr if isinstance(done.stderr, bytes) else b""

            status, err = await self._call(finish)
        if status != 0:
            raise Unreachable(f"{self.name}: tar of {names} in {remote_dir} exited {status}: {_tail(err)}")
        return received

    async def aclose(self) -> None:
        await self._channel.aclose()
        async with self._conn_lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                async def close() -> None:
                    conn.close()
                    await conn.wait_closed()  # a broken one says so here

                with trio.CancelScope(shield=True), trio.move_on_after(5), suppress(*_LOST, CallCancelled):
                    await self._aio().run(close)


async def _file_chunks(path: Path) -> AsyncGenerator[bytes, None]:
    f = await to_thread(_open_binary, path, "rb")
    try:
        while chunk := await to_thread(f.read, CHUNK):
            yield chunk
    finally:
        f.close()


def _open_binary(path: Path, mode: str) -> BinaryIO:
    return cast("BinaryIO", open(path, mode))  # closed by the caller, on its trio thread


def _tail(err: bytes) -> str:
    return err.decode(errors="replace").strip()[-300:]


def _tar_args(where: list[str]) -> list[str]:
    return ["tar", "-cf", "-", *where]


def _tar_env() -> dict[str, str]:
    """This process's environment as it is now (an embedder may change it between runs), and on
    macOS no ._ files for extended attributes."""
    return {**os.environ, "COPYFILE_DISABLE": "1"}


async def _tar_chunks(where: list[str]) -> AsyncGenerator[bytes, None]:
    """The bytes of a local `tar` as it makes them."""
    with tempfile.TemporaryFile() as err:
        proc = await open_process(
            _tar_args(where), stdout=subprocess.PIPE, stderr=err, env=_tar_env(),
        )
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.receive_some(CHUNK):
                yield chunk if isinstance(chunk, bytes) else bytes(chunk)
            await proc.wait()
            if proc.returncode != 0:
                err.seek(0)
                raise Unreachable(f"local tar ({' '.join(where)}) failed: {_tail(err.read(2000))}")
        finally:
            with trio.CancelScope(shield=True):
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                await proc.stdout.aclose()


async def _piped(commands: list[list[str]], err: Any) -> int:
    """Run `a | b` and return b's exit status; a failing `a` raises (b may have taken a short stream)."""
    read_end, write_end = os.pipe()
    procs: list[Process] = []
    try:
        try:
            procs.append(await open_process(
                commands[0], stdout=write_end, stderr=err, env=_tar_env(),
            ))
            procs.append(await open_process(
                commands[1], stdin=read_end, stdout=subprocess.DEVNULL, stderr=err,
            ))
        finally:
            os.close(read_end)
            os.close(write_end)
        for proc in procs:
            await proc.wait()
    finally:
        with trio.CancelScope(shield=True):
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    if procs[0].returncode != 0:
        raise Unreachable(f"local {' '.join(commands[0])} exited {procs[0].returncode}")
    code = procs[1].returncode
    assert code is not None  # every process was waited for above
    return code
