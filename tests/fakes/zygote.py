"""Warm starts for the fake's serverless workers (issue 24): one process per test process, the zygote,
imports RunPod's SDK and actor-run's handler once, and forks each worker from itself instead of the
fake starting a fresh interpreter for it (a fresh one spent about 0.4 s of CPU on imports, and as
much again on the subprocess py-cpuinfo starts when the SDK's rp_debugger asks it at import time).

The worker stays the real thing: its own process, in a session of its own (setsid, as
`Popen(start_new_session=True)` does), stdin from /dev/null, stdout and stderr on the file
descriptor the fake hands over, no other descriptor open, in its own working folder, with exactly
the environment the fake gives it, running `python -m actor_run.protocols.serverless [args]` as
`__main__` (runpy.run_module): RunPod's `serverless.start`, its job-take loop, its ping process.
(`python -c CODE [args]` too, CODE run in a fresh `__main__` as `-c` runs it: another image's
handler under the same SDK, as some tests give the fake.)

What the zygote's imports read from the environment, and how a worker gets its own:
- every module of the `runpod` package and of `actor_run.protocols.serverless` is dropped from
  sys.modules in the worker and imported again there, under the worker's environment: the SDK reads
  it at import (worker_state's WORKER_ID and IS_LOCAL_TEST, rp_job's JOB_GET_URL, rp_http's done and
  stream URLs, rp_ping's Heartbeat at worker.py's import, rp_logger's level, rp_gpu_fitness and
  rp_system_fitness limits, runpod.api_key from $HOME/.runpod/config.toml, endpoint_url_base);
- but for KEPT: runpod.serverless.utils.rp_debugger, which imports nothing of runpod and reads no
  environment; its import is where py-cpuinfo's subprocess runs, and what it keeps (the processor's
  name, the OS and Python versions) is the machine's, the same for every worker;
- every other module (aiohttp, requests, urllib3, the standard library, ...) stays as the zygote
  imported it. The zygote records each environment read made while it imports, other than those
  made by the modules above (`os.environ` accesses, whoever makes them: a read from inside a kept
  module's function that a re-imported module's top level called counts as kept), and a worker whose
  environment differs from the zygote's on any key so read, or on what the interpreter reads when
  it starts (PYTHON*, LANG, LC_*), is not forked: `spawn` answers None and the fake starts a fresh
  interpreter, as before.
The zygote runs one thread (fork is safe) and holds no descriptor but its own socket; after its
imports it moves every object to the collector's permanent generation (gc.freeze), so a worker's
collections do not walk what it inherited.

Conversation, over AF_UNIX SOCK_SEQPACKET (one JSON message each):
    zygote -> client, once ready:  {"frozen": {key: value or null}, "startup": {key: value}}
                                   or {"error": why}: then nothing is forked
    client -> zygote:              {"module", "args", "env", "cwd"}, with fds [channel, stdout, stderr]
    zygote -> that channel:        {"pid": n} with fd [pidfd] once the worker is set up (as Popen
                                   returns once its child has exec'd), or {"error": why not};
                                   then {"status": wait status} once it reaped the worker, and the
                                   channel is closed
The client signals a worker through its pidfd (never a reused pid) and waits for it on its channel.
The zygote is started once per test process (lazily; again if it died) and ends when the client's
end of its socket closes (at exit, or when the test process dies however it dies), after killing
the process groups of workers still running and reaping them: it leaves no process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from typing import Any

MODULE = "actor_run.protocols.serverless"  # the image's command: python -m MODULE
PURGED = ("runpod", MODULE)  # packages imported again in each worker, under its own environment
KEPT = frozenset({"runpod.serverless.utils.rp_debugger"})  # ... but for these (see the docstring)
WARM = ("runpod", f"{MODULE}.handler")  # what the zygote imports
# frames between an environment read and the module that made it: they keep nothing of what they read
_ACCESS = frozenset({"os", "_collections_abc", "collections.abc", "posixpath", "genericpath", "pathlib", __name__})
# modules outside PURGED that go through the whole environment while the zygote imports, and what of it
# they keep: the keys they depend on ("X_*": every key that starts with "X_"); any other module that
# does so makes the zygote refuse to fork anything
ITERATES = {
    "tqdm.utils": ("TQDM_*",),  # envwrap: TQDM_* variables become tqdm's defaults
    "platform": ("PATH",),  # _syscmd_file: runs `file` (under LC_ALL=C) with a copy of the environment
}
_BOOT = "import runpy, sys; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"
HELLO_S = 300.0  # bound on the zygote's imports (seconds of a loaded 2-core machine, not of a quiet one)
ANSWER_S = 60.0  # bound on one fork's answer


def _startup_keys(env: dict[str, str]) -> dict[str, str]:
    """What the interpreter reads from the environment before any module of ours runs."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG"}


def _seen(env: dict[str, str], key: str) -> Any:
    """What a read of `key` finds in `env`, as the zygote's recorder notes it ("X_*": those keys)."""
    if key.endswith("*"):
        return {k: v for k, v in env.items() if k.startswith(key[:-1])}
    return env.get(key)


def purged(name: str) -> bool:
    return name not in KEPT and any(name == p or name.startswith(p + ".") for p in PURGED)


# --- the client: in the test process -----------------------------------------------------------------

class ForkedProcess:
    """A worker forked by the zygote: what the fake uses of subprocess.Popen (pid, returncode, poll,
    wait, send_signal, terminate, kill). Not our child: the zygote reaps it and says how it ended."""

    def __init__(self, pid: int, pidfd: int, channel: socket.socket) -> None:
        self.pid, self._pidfd, self._channel = pid, pidfd, channel
        self.returncode: int | None = None
        self.status: int | None = None  # the wait status the zygote reaped (None: unknown)
        self._done = False
        self._lock = threading.Lock()

    def _finish(self, status: int | None) -> None:
        self.status = status
        self.returncode = None if status is None else os.waitstatus_to_exitcode(status)
        self._done = True
        self._channel.close()
        os.close(self._pidfd)

    def _settle(self, timeout: float | None) -> bool:
        """Under self._lock: read the zygote's word on this worker, waiting up to `timeout`."""
        if self._done:
            return True
        r, _, _ = select.select([self._channel], [], [], timeout)
        if not r:
            return False
        data = self._channel.recv(4096)
        if data:
            self._finish(int(json.loads(data)["status"]))
            return True
        # the zygote died before it reaped the worker (orphaned to init, which reaps it): its exit
        # still makes its pidfd readable, but how it ended is nobody's to tell
        r, _, _ = select.select([self._pidfd], [], [], timeout)
        if not r:
            return False
        self._finish(None)
        return True

    def poll(self) -> int | None:
        with self._lock:
            self._settle(0)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise subprocess.TimeoutExpired(MODULE, timeout or 0)
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._settle(left):
                raise subprocess.TimeoutExpired(MODULE, timeout or 0)
            return self.returncode
        finally:
            self._lock.release()

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self._settle(0):
                return  # ended and reaped: as Popen, nothing to signal
            with contextlib.suppress(ProcessLookupError):  # ended, not yet reaped
                signal.pidfd_send_signal(self._pidfd, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The client's end: starts the zygote (start), forks workers from it (spawn), ends it (close)."""

    def __init__(self, extra_env: dict[str, str] | None = None) -> None:
        self.extra_env = dict(extra_env or {})  # set in the zygote's own environment (a test's marker)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._hello: dict[str, Any] | None = None
        self._dir = ""
        self.starts = 0  # zygotes started (more than one: one died and was started again)
        self.refused: list[str] = []  # why a worker was not forked (then the fake started it fresh)

    def start(self) -> None:
        """Start the zygote if none runs; returns at once (its imports go on meanwhile)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._reset()
        self._dir = tempfile.mkdtemp(prefix="actor-run-zygote-")
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # the fake's base for a worker's environment; a HOME of its own, so that the SDK's import (for
        # runpod.api_key) reads no developer's ~/.runpod/config.toml into memory the workers inherit
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD")} | {"HOME": self._dir}
        env |= self.extra_env
        with open(os.path.join(self._dir, "zygote.log"), "ab") as log:
            self._proc = subprocess.Popen([sys.executable, "-c", _BOOT, __file__, str(there.fileno())],
                                          pass_fds=[there.fileno()], stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env, cwd=self._dir, start_new_session=True)
        there.close()
        self._sock, self._hello = here, None
        self.starts += 1

    def _ready(self) -> dict[str, Any]:
        """Under the lock: the zygote's hello, waited for (bounded) the first time."""
        self._start()
        assert self._sock is not None
        if self._hello is None:
            r, _, _ = select.select([self._sock], [], [], HELLO_S)
            data = self._sock.recv(1 << 20) if r else b""
            self._hello = json.loads(data) if data else {"error": f"no answer from the zygote: {self._log()}"}
        return self._hello

    def _log(self) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self._dir, "zygote.log"), "rb") as f:
            return f.read()[-2000:].decode(errors="replace")
        return ""

    def _mismatch(self, hello: dict[str, Any], env: dict[str, str]) -> str:
        if "error" in hello:
            return str(hello["error"])
        if _startup_keys(env) != hello["startup"]:
            return "the interpreter's start-up environment differs (PYTHON*, LANG, LC_*)"
        differ = sorted(k for k, v in hello["frozen"].items() if _seen(env, k) != v)
        return f"the zygote's imports read {differ} from an environment that differs" if differ else ""

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, out: int) -> ForkedProcess | None:
        """Fork `argv` (`python -m actor_run.protocols.serverless ...` or `python -c CODE ...`) from the
        zygote, its stdout and stderr on `out`; None if it cannot be forked (another command, or an
        environment the zygote's imports would not match: see `refused`)."""
        if argv[:3] == [sys.executable, "-m", MODULE]:
            run = {"module": MODULE, "args": argv[3:]}
        elif argv[:2] == [sys.executable, "-c"] and len(argv) > 2:
            run = {"code": argv[2], "args": argv[3:]}
        else:
            return None
        request = json.dumps(run | {"env": env, "cwd": str(cwd)}).encode()
        with self._lock:
            for _ in range(2):  # a zygote found dead is started again, once
                why = self._mismatch(self._ready(), env)
                if why:
                    self.refused.append(why)
                    return None
                proc = self._fork(request, out)
                if proc is not None:
                    return proc
                self._reset()
            raise RuntimeError(f"the zygote died twice in a row: {self._log()}")

    def _fork(self, request: bytes, out: int) -> ForkedProcess | None:
        assert self._sock is not None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self._sock, [request], [theirs.fileno(), out, out])
        except OSError:  # the zygote is gone
            mine.close()
            return None
        finally:
            theirs.close()
        r, _, _ = select.select([mine], [], [], ANSWER_S)
        data, fds, _, _ = socket.recv_fds(mine, 4096, 1) if r else (b"", [], 0, None)
        answer = json.loads(data) if data else {}
        if "error" in answer:  # as Popen raises what its child could not do before exec
            mine.close()
            raise OSError(f"the worker could not be set up: {answer['error']}")
        if not fds:
            mine.close()
            return None
        return ForkedProcess(int(answer["pid"]), fds[0], mine)

    @property
    def pid(self) -> int | None:
        """The running zygote's pid (None before its start)."""
        return None if self._proc is None else self._proc.pid

    def cpu_seconds(self) -> float:
        """The zygote's CPU, its own and its reaped workers' (and theirs), from /proc; 0 if none runs."""
        proc = self._proc
        if proc is None:
            return 0.0
        try:
            with open(f"/proc/{proc.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime

    def _reset(self) -> None:
        """Under the lock: end the zygote (closing its socket is what ends it) and remove its folder."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""

    def close(self) -> None:
        with self._lock:
            self._reset()


_zygote = Zygote()
atexit.register(_zygote.close)


def zygote() -> Zygote:
    """This test process's zygote (one per process; started by its first use)."""
    return _zygote


# --- the zygote: its own process ---------------------------------------------------------------------

def _warm() -> dict[str, str | None]:
    """Import WARM; return the environment reads made meanwhile that stay frozen in a worker."""
    frozen: dict[str, str | None] = {}
    environ = os.environ
    plain = type(environ)

    def note(key: str | None) -> None:
        """An access to `key` (None: the environment gone through whole)."""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_globals.get("__name__", "")
            if name in _ACCESS:
                f = f.f_back  # type: ignore[assignment]
                continue
            if not purged(name):
                keys = ITERATES.get(name, (key or "*",))  # those modules' reads are what the table says
                for k in keys:
                    frozen[k] = seen(k) if k != "*" else f"{name}.{f.f_code.co_name}"
                return
            if f.f_code.co_name == "<module>":
                return  # read by a re-imported module's top level, or what it called: the worker reads its own
            f = f.f_back  # type: ignore[assignment]
        if key is None:
            frozen["*"] = "?"
        else:
            frozen[key] = seen(key)

    def seen(key: str) -> Any:
        if key.endswith("*"):  # the keys with this prefix, and their values
            return {k: plain.__getitem__(environ, k) for k in list(plain.__iter__(environ)) if k.startswith(key[:-1])}
        try:
            return plain.__getitem__(environ, key)
        except KeyError:
            return None

    class Recording(plain):  # type: ignore[valid-type, misc]
        def __getitem__(self, key: str) -> str:
            note(key)
            return super().__getitem__(key)  # type: ignore[no-any-return]

        def __iter__(self) -> Any:
            note(None)
            return super().__iter__()

    environ.__class__ = Recording
    try:
        for name in WARM:
            importlib.import_module(name)
    finally:
        environ.__class__ = plain
    return frozen


def _serve(control: socket.socket) -> tuple[dict[str, Any], int, int, int] | None:
    """The zygote's loop; returns only in a forked worker (its request, its stdout and stderr fds,
    and the pipe to close once it is set up)."""
    try:
        frozen = _warm()
        threads = threading.active_count()
        fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
        extra = [fd for fd in fds if fd not in (0, 1, 2, control.fileno())]
        hello: dict[str, Any] = {"frozen": frozen, "startup": _startup_keys(dict(os.environ))}
        if "*" in frozen:
            hello = {"error": f"{frozen['*']} went through the whole environment at import (not in ITERATES)"}
        elif threads != 1:
            hello = {"error": f"the zygote's imports started threads ({threads})"}
        elif len(extra) > 1:  # listdir's own descriptor is one
            hello = {"error": f"the zygote's imports left descriptors open: {extra}"}
    except Exception as exc:  # told to the client, which then forks nothing
        hello = {"error": f"the zygote's imports failed: {exc!r}"}
    gc.collect()
    gc.freeze()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what wakes the loop
    control.sendall(json.dumps(hello).encode())
    channels: dict[int, socket.socket] = {}

    def told(pid: int, status: int) -> None:
        chan = channels.pop(pid)
        with contextlib.suppress(OSError):  # the client's end may be closed already
            chan.sendall(json.dumps({"status": status}).encode())
        chan.close()

    def reap() -> None:
        while channels:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            told(pid, status)

    while True:
        ready, _, _ = select.select([control, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap()
        if control not in ready:
            continue
        data, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
        if not data:
            break  # the client is gone: so are we
        channel, out, err = socket.socket(fileno=fds[0]), fds[1], fds[2]
        request = json.loads(data)
        if "error" in hello:
            channel.close()
            os.close(out)
            os.close(err)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        set_r, set_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker: drop what is the zygote's, and go
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for s in (control, channel, *channels.values()):
                s.close()
            for fd in (wake_r, wake_w, set_r):
                os.close(fd)
            return request, out, err, set_w
        pidfd = os.pidfd_open(pid)  # before any reap: it is this worker's, whatever pid comes later
        for fd in (out, err, set_w):
            os.close(fd)
        # as Popen returns only once its child is set up (its own session, its descriptors, its
        # folder): wait until the worker closes its end, or writes why it could not be set up
        with os.fdopen(set_r, "rb") as f:
            failed = f.read()
        answer = {"error": failed.decode(errors="replace")} if failed else {"pid": pid}
        with contextlib.suppress(OSError):
            socket.send_fds(channel, [json.dumps(answer).encode()], [] if failed else [pidfd])
        os.close(pidfd)
        channels[pid] = channel
    for pid in channels:  # workers still running when the test process ended, and their groups
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    while channels:
        pid, status = os.waitpid(-1, 0)
        told(pid, status)
    return None


def _become(request: dict[str, Any], out: int, err: int, set_up: int) -> None:
    """In the forked worker: what Popen(argv, stdin=DEVNULL, stdout=out, stderr=STDOUT, env=env,
    cwd=cwd, start_new_session=True) does before exec (then closes `set_up`, or writes there why it
    failed), then `python -m MODULE args` (or -c CODE)."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, set_up)  # close_fds=True: none but 0, 1, 2
        os.closerange(set_up + 1, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
    except BaseException as exc:
        os.write(set_up, repr(exc).encode())
        os._exit(127)
    os.close(set_up)
    for name in [m for m in sys.modules if purged(m)]:
        del sys.modules[name]
    if "code" in request:  # python -c CODE args
        sys.path.insert(0, "")
        sys.argv = ["-c", *request["args"]]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(request["code"], "<string>", "exec"), main.__dict__)
        return
    sys.path.insert(0, os.getcwd())  # as `python -m` puts it
    sys.argv = [sys.executable, *request["args"]]  # run_module puts the module's file in argv[0]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _forked = _serve(socket.socket(fileno=int(sys.argv[2])))
    if _forked is not None:
        _become(*_forked)
