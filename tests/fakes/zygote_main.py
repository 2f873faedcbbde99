"""The zygote's own process (started by fakes/zygote.py, which says what it is for and how it is
talked to): it imports WARM while it notes the environment reads the imports make, says hello, then
forks a worker for each request, answers its pid and pidfd once the worker is set up, and reaps it.
Run by `python -c "...runpy.run_path(this file)"` with tests/fakes NOT on sys.path (tests/fakes/
runpod.py would hide RunPod's SDK), so it imports nothing of the tests.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import types
from typing import Any

MODULE = "actor_run.protocols.serverless"  # the image's command: python -m MODULE
PURGED = ("runpod", MODULE)  # packages imported again in each worker, under its own environment
KEPT = frozenset({"runpod.serverless.utils.rp_debugger"})  # ... but these (fakes/zygote.py says why)
WARM = ("runpod", f"{MODULE}.handler")  # what the zygote imports (unless told otherwise: a test's)
# frames between an environment read and the module that made it: they keep nothing of what they read
_ACCESS = frozenset({"os", "_collections_abc", "collections.abc", "posixpath", "genericpath", "pathlib", __name__})
# modules outside PURGED that go through the whole environment while the zygote imports, and what of it
# they keep: the keys they depend on ("X_*": every key that starts with "X_"); any other module that
# does so makes the zygote refuse to fork anything
ITERATES = {
    "tqdm.utils": ("TQDM_*",),  # envwrap: TQDM_* variables become tqdm's defaults
    "platform": ("PATH",),  # _syscmd_file: runs `file` (under LC_ALL=C) with a copy of the environment
}


def startup_keys(env: dict[str, str]) -> dict[str, str]:
    """What the interpreter reads from the environment before any module of ours runs."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "LC_")) or k == "LANG"}


def seen_in(env: dict[str, str], key: str) -> Any:
    """What a read of `key` finds in `env`, as the zygote's recorder notes it ("X_*": those keys)."""
    if key.endswith("*"):
        return {k: v for k, v in env.items() if k.startswith(key[:-1])}
    return env.get(key)


def purged(name: str) -> bool:
    return name not in KEPT and any(name == p or name.startswith(p + ".") for p in PURGED)


def _warm(modules: list[str]) -> dict[str, Any]:
    """Import `modules`; return the environment reads made meanwhile that stay frozen in a worker."""
    frozen: dict[str, Any] = {}  # key -> the value the import saw (None: unset; "X_*": a dict)
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
        for name in modules:
            importlib.import_module(name)
    finally:
        environ.__class__ = plain
    return frozen


def _serve(control: socket.socket, warm: list[str]) -> tuple[dict[str, Any], int, int, int] | None:
    """The zygote's loop; returns only in a forked worker (its request, its stdout and stderr fds,
    and the pipe to close once it is set up)."""
    try:
        frozen = _warm(warm)
        threads = threading.active_count()
        fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
        extra = [fd for fd in fds if fd not in (0, 1, 2, control.fileno())]
        hello: dict[str, Any] = {"frozen": frozen, "startup": startup_keys(dict(os.environ))}
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
    _forked = _serve(socket.socket(fileno=int(sys.argv[2])), json.loads(sys.argv[3]))
    if _forked is not None:
        _become(*_forked)
