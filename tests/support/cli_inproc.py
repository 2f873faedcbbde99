"""`actor-run` for tests: in this process by default, as a child process when the test needs one.

    run_cli(["runs", "--json"], env=ENV, cwd=tmp)          # like subprocess.run([python, -m, actor_run, ...])
    run_cli([...], process=True)                           # a real child (`actor-run ssh`, timing, signals)
    start_cli([...], env=ENV, cwd=tmp)                     # a Popen: kill -9, --follow, two controllers

A test worker has already imported everything an `actor-run` process imports (0.45-0.8 s of CPU
per child, about 370 children per suite), so a command that only has to print, exit and write is
run here, through the same path `python -m actor_run` takes (`cli.entry()`: the collector tuned,
`main()`, stdout flushed, `sys.exit`), with what a child would have had of its own:

- os.environ is the given `env` (None: this process's), the working folder is `cwd`, sys.argv the
  command's; stdin, stdout and stderr are pipes' text streams (isatty() False, a `.buffer` each),
  decoded as `subprocess.run(text=True)` decodes (universal newlines); warnings print as a fresh
  interpreter's default filters say (not the suite's "error");
- SystemExit is the return code; a crash is exit 1 with its traceback on stderr (as a child's);
  KeyboardInterrupt goes on up; past `timeout` a SIGALRM raises subprocess.TimeoutExpired inside
  the command (its `with Runner` still deletes its machines on the way out);
- and what a process's end would have undone is undone: loguru's handlers, signal handlers,
  the collector's thresholds and freeze, the umask, environment variables, sys.meta_path, the
  redactor's secrets, the PostgreSQL read pools the command opened (atexit's `close_pools`). A
  thread the command started that is still alive 10 s later fails the call.

`undone()` names what the last in-process call left behind and the harness had to restore (the
product should leave nothing but what a CLI process owns: the collector and loguru).

What stays a child's (start_cli, or process=True): a command sent a signal, killed, or read while
it runs (`--follow`, `logs -f`, two controllers); `actor-run ssh` that execs ssh; a closed stdout
(exit 141); a terminal; anything about the process itself (imports, startup). Not captured here,
as a child's pipes would: what a grandchild writes to the inherited fd 2 (the local cloud's shell
keeps the controller's stderr; it writes nothing there), and what a test's own threads print to
sys.stderr during the call would land in the call's stderr (the fakes log through `logging`,
which pytest captures).
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import loguru  # loaded before any command: its default handler is this process's own stderr

import actor_run
from actor_run.protocols import redact
from actor_run.supervisors.cli import entry

from .waits import settled

CLI = [sys.executable, "-m", "actor_run"]
THREAD_WAIT_S = 10.0
# a fresh interpreter's warning filters (python -c "import warnings; print(warnings.filters)"), not the suite's
_FRESH_FILTERS: list[Any] = [
    ("default", None, DeprecationWarning, "__main__", 0),
    ("ignore", None, DeprecationWarning, None, 0),
    ("ignore", None, PendingDeprecationWarning, None, 0),
    ("ignore", None, ImportWarning, None, 0),
    ("ignore", None, ResourceWarning, None, 0),
]
_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
_undone: list[str] = []


def undone() -> list[str]:
    """What the last in-process call changed of this process and the harness put back."""
    return list(_undone)


def _is_idle_pool(t: threading.Thread) -> bool:
    # as conftest's no_leaks: trio keeps idle to_thread workers for 10 s; the actor pool's workers hold nothing.
    # The test's fakes live in this process too and start threads of their own when asked (a cluster's
    # skylet, a machine's porch, a scale-down): named `fake-*` / `porch-*`, they are the fake's, not the command's
    return t.name.startswith(("Trio thread", "Trio worker", "actor-run-pool-", "fake-", "porch-"))


def _pipe(data: bytes = b"", *, errors: str = "strict") -> io.TextIOWrapper:
    """A text stream over bytes as a pipe's is: not a terminal, UTF-8, with a `.buffer`."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors=errors, write_through=False)


def _text(stream: io.TextIOWrapper) -> str:
    """What subprocess.run(text=True) makes of what a child wrote (its universal newlines)."""
    with contextlib.suppress(ValueError):  # a command may have closed it
        stream.flush()
    raw = stream.buffer
    data = raw.getvalue() if isinstance(raw, io.BytesIO) else b""
    return data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")


class _Snapshot:
    """The process-global state a command may change, taken before it runs and put back after."""

    def __init__(self) -> None:
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv = sys.argv
        self.streams = (sys.stdin, sys.stdout, sys.stderr)
        self.meta_path = list(sys.meta_path)
        self.umask = os.umask(0o022)
        os.umask(self.umask)
        self.gc_thresholds = gc.get_threshold()
        # whether the command froze the heap (the CLI's tune_gc) is recorded as it calls gc.freeze: the
        # frozen count is a walk of the whole frozen generation (every object of this test worker once a
        # command froze it; py-spy: that one line was 7 % of the workers' samples, at each call's restore)
        self.froze = False
        self._freeze = gc.freeze

        def freeze() -> None:
            self.froze = True
            self._freeze()

        gc.freeze = freeze
        self.signals = {s: signal.getsignal(s) for s in _SIGNALS}
        core = loguru.logger._core  # type: ignore[attr-defined]  # loguru 0.7: handlers by id under one lock
        self.log_handlers = dict(core.handlers)
        tree = logging.getLogger("actor_run")  # the CLI forwards it into loguru (supervisors/cli/console.py)
        self.tree_logging = (list(tree.handlers), tree.level)
        self.secrets = (set(redact.SECRETS._values), redact.SECRETS._pattern)
        self.threads = {t.ident for t in threading.enumerate()}
        pools = sys.modules.get("actor_run.supervisors.ledger.db")
        self.pools = set(pools._pools) if pools is not None else set()

    def restore(self, call_env: dict[str, str] | None) -> list[str]:
        """Put everything back; what had to be put back (beyond the call's own env, cwd, argv, streams)."""
        changed: list[str] = []
        # PostgreSQL read pools the command opened: a child closes them at exit (atexit), with their threads
        db = sys.modules.get("actor_run.supervisors.ledger.db")
        if db is not None:
            with db._pools_lock:
                mine = {url: pool for url, pool in db._pools.items() if url not in self.pools}
                for url in mine:
                    del db._pools[url]
            for pool in mine.values():
                pool.close()
        core = loguru.logger._core  # type: ignore[attr-defined]
        for hid in [h for h in core.handlers if h not in self.log_handlers]:
            loguru.logger.remove(hid)  # stops it (a run log's file is closed)
        with core.lock:
            if core.handlers != self.log_handlers:
                changed.append("loguru handlers")
            core.handlers = dict(self.log_handlers)
            core.min_level = min((h.levelno for h in self.log_handlers.values()), default=float("inf"))
        tree = logging.getLogger("actor_run")
        if (list(tree.handlers), tree.level) != self.tree_logging:
            changed.append("loguru handlers")  # the same change, made through the stdlib logger it forwards
            tree.handlers[:], level = self.tree_logging
            tree.setLevel(level)
        for s, handler in self.signals.items():
            if signal.getsignal(s) is not handler and handler is not None:
                changed.append(f"signal {signal.Signals(s).name}")
                signal.signal(s, handler)
        if gc.get_threshold() != self.gc_thresholds:
            changed.append("gc thresholds")
            gc.set_threshold(*self.gc_thresholds)
        gc.freeze = self._freeze
        if self.froze:
            changed.append("gc freeze")
            gc.unfreeze()  # a constant-time splice back into the oldest generation
        umask = os.umask(self.umask)
        if umask != self.umask:
            changed.append(f"umask {umask:o}")
        expected = self.environ if call_env is None else call_env
        if dict(os.environ) != expected:
            keys = sorted(k for k in {*os.environ, *expected} if os.environ.get(k) != expected.get(k))
            changed.append(f"environment {', '.join(keys)}")
        if dict(os.environ) != self.environ:
            os.environ.clear()
            os.environ.update(self.environ)
        if os.getcwd() != self.cwd:
            os.chdir(self.cwd)
        if sys.meta_path != self.meta_path:
            changed.append("sys.meta_path")
            sys.meta_path[:] = self.meta_path
        values, pattern = self.secrets
        with redact.SECRETS._lock:
            redact.SECRETS._values, redact.SECRETS._pattern = values, pattern
        sys.argv = self.argv
        sys.stdin, sys.stdout, sys.stderr = self.streams
        return changed

    def threads_left(self) -> list[str]:
        """The command's threads still alive after a bounded wait (10 s)."""
        return settled(lambda: [t.name for t in threading.enumerate()
                                if t.ident not in self.threads and t.is_alive() and not _is_idle_pool(t)],
                       THREAD_WAIT_S, every=0.02)


@contextlib.contextmanager
def _deadline(timeout: float | None, args: Sequence[str]) -> Iterator[None]:
    """subprocess.TimeoutExpired raised in the command (this thread) past `timeout`."""
    if timeout is None or threading.current_thread() is not threading.main_thread():
        yield  # (a signal is this process's main thread's: a command run elsewhere is bounded by its test)
        return

    def expired(signum: int, frame: Any) -> None:
        raise subprocess.TimeoutExpired([*CLI, *args], timeout)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _in_process(args: list[str], cwd: str | Path | None, env: dict[str, str] | None, input: str | None,
                timeout: float | None) -> subprocess.CompletedProcess[str]:
    before = _Snapshot()
    stdin, stdout, stderr = _pipe((input or "").encode()), _pipe(), _pipe(errors="backslashreplace")
    code: int = 0
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = [str(Path(actor_run.__file__).parent / "__main__.py"), *args]
        sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
        with warnings.catch_warnings(), _deadline(timeout, args):
            warnings.filters[:] = _FRESH_FILTERS
            try:
                entry()  # what `python -m actor_run` runs (actor_run/__main__.py)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if exc.code is not None and not isinstance(exc.code, int):
                    stderr.write(f"{exc.code}\n")
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                raise
            except BaseException:  # a crash: a child prints its traceback and exits 1
                stderr.write(traceback.format_exc())
                code = 1
    finally:
        _undone[:] = before.restore(env)
        left = before.threads_left()
    out, err = _text(stdout), _text(stderr)
    if left:
        raise AssertionError(f"`actor-run {' '.join(args)}` left threads running: {left}\n{err}")
    return subprocess.CompletedProcess([*CLI, *args], code, out, err)


def run_cli(args: Sequence[str | Path], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
            input: str | None = None, stdin: int | None = None, timeout: float | None = 120, process: bool = False
            ) -> subprocess.CompletedProcess[str]:
    """`actor-run ARGS` as `subprocess.run([python, -m, actor_run, *args], capture_output=True,
    text=True, ...)` returns it; in this process unless `process` (then a real child). `stdin`:
    subprocess.DEVNULL or None; in this process stdin is never a terminal, and empty without `input`."""
    argv = [str(a) for a in args]
    if stdin not in (None, subprocess.DEVNULL):
        raise ValueError("run_cli: stdin is subprocess.DEVNULL or None (a terminal needs a real child: start_cli)")
    if process:
        return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
                              input=input, stdin=stdin)
    return _in_process(argv, cwd, env, input, timeout)


def start_cli(args: Sequence[str | Path], *, cwd: str | Path | None = None, env: dict[str, str] | None = None,
              **popen: Any) -> subprocess.Popen[str]:
    """`actor-run ARGS` as a child process running on (stdout and stderr piped, text, unless given)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*CLI, *(str(a) for a in args)], text=True, cwd=cwd, env=env, **popen)
