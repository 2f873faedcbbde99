"""Warm starts for the fake's serverless workers (issue 24): one process per test process, the zygote,
imports RunPod's SDK and actor-run's handler once, and forks each worker from itself instead of the
fake starting a fresh interpreter for it (a fresh one spent about 0.6 s of CPU on imports, and as
much again on the Python subprocess py-cpuinfo runs when the SDK's rp_debugger asks it at import
time; a forked one spends about 0.1 s in all, its job included).

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
  imported it. While it imports, the zygote notes each `os.environ` access and whose it is: the
  innermost frame outside os, posixpath and pathlib. A re-imported module's (up to its top-level
  code) is read again by the worker; any other module's is frozen, and a worker whose environment
  differs from the zygote's on a key so read, or on what the interpreter reads as it starts
  (PYTHON*, LANG, LC_*), is not forked: `spawn` answers None and the fake starts a fresh
  interpreter, as before. A module that goes through the whole environment is allowed only if
  ITERATES says which keys it keeps (tqdm: TQDM_*; platform: PATH).
The zygote's own environment is the test process's (less RUNPOD_*, with a HOME of its own, so the
SDK's import reads no developer's ~/.runpod key into memory the workers inherit); it is also what
/proc/<worker>/environ shows (the kernel's copy, made at exec), while os.environ and getenv, what
the SDK, the handler and the command read, are the worker's own.
The zygote runs one thread (fork is safe) and holds no descriptor but its own socket; after its
imports it moves every object to the collector's permanent generation (gc.freeze), so a worker's
collections do not walk what it inherited.

Conversation, over AF_UNIX SOCK_SEQPACKET (one JSON message each):
    zygote -> client, once ready:  {"frozen": {key: value or null}, "startup": {key: value}}
                                   or {"error": why}: then nothing is forked
    client -> zygote:              {"module" or "code", "args", "env", "cwd"},
                                   with fds [channel, stdout, stderr]
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
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fakes.zygote_main import KEPT, MODULE, PURGED, WARM, seen_in, startup_keys

__all__ = ["KEPT", "MODULE", "PURGED", "ForkedProcess", "Zygote", "zygote"]

MAIN = str(Path(__file__).with_name("zygote_main.py"))  # what the zygote runs
_BOOT = "import runpy, sys; del sys.path[0]; runpy.run_path(sys.argv[1], run_name='__main__')"
HELLO_S = 300.0  # bound on the zygote's imports (seconds of a loaded 2-core machine, not of a quiet one)
ANSWER_S = 60.0  # bound on one fork's answer


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

    def __init__(self, extra_env: dict[str, str] | None = None, warm: tuple[str, ...] = WARM) -> None:
        self.extra_env = dict(extra_env or {})  # set in the zygote's own environment (a test's marker)
        self.warm = warm  # what it imports before it forks (a test of its mechanics alone: none)
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
            argv = [sys.executable, "-c", _BOOT, MAIN, str(there.fileno()), json.dumps(self.warm)]
            self._proc = subprocess.Popen(argv, pass_fds=[there.fileno()], stdin=subprocess.DEVNULL, stdout=log,
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
        if startup_keys(env) != hello["startup"]:
            return "the interpreter's start-up environment differs (PYTHON*, LANG, LC_*)"
        differ = sorted(k for k, v in hello["frozen"].items() if seen_in(env, k) != v)
        return f"the zygote's imports read {differ} from an environment that differs" if differ else ""

    def spawn(self, argv: list[str], env: dict[str, str], cwd: str, out: int,
              err: int | None = None) -> ForkedProcess | None:
        """Fork `argv` (`python -m actor_run.protocols.serverless ...` or `python -c CODE ...`) from the
        zygote, its stdout on `out` and its stderr on `err` (None: `out` too); None if it cannot be
        forked (another command, or an environment the zygote's imports would not match: `refused`)."""
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
                proc = self._fork(request, out, out if err is None else err)
                if proc is not None:
                    return proc
                self._reset()
            raise RuntimeError(f"the zygote died twice in a row: {self._log()}")

    def _fork(self, request: bytes, out: int, err: int) -> ForkedProcess | None:
        assert self._sock is not None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self._sock, [request], [theirs.fileno(), out, err])
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
