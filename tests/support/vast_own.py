"""Vast.ai's own `vastai` command, many times in ONE process of Vast's venv: what
tests/protocols/clouds/test_vastai_own.py runs the vendor's CLI with. A fresh `vastai` spends about
1.7 s of CPU importing the vendor's package (vastai/__init__.py pulls in vastai.serverless, aiohttp,
distutils, setuptools' pkg_resources) before it reads its arguments; this process imports it once.

Run as `<vast python> tests/support/vast_own.py <path of the venv's vastai script>`, with the
environment the commands are to see (the test's HOME and XDG_* folders: the vendor reads them at
import). It says hello on stdout, one JSON line: {"version": vastai's installed version} (the pin
the test checks; no other interpreter for it) or {"error": traceback}. Then each line on stdin,
{"argv": [...]}, is answered on stdout by one line {"code", "stdout", "stderr", "left"}: the
command's exit status, what it wrote on its file descriptors 1 and 2 (the bytes, as text with
surrogateescape), and what it left behind that a fresh process's exit would have cleaned up
(threads, open descriptors, atexit handlers: the client fails on any). The process ends when its
stdin closes.

One request, as the console script runs it (`sys.argv[0] = <script>; sys.exit(main())`):
- sys.argv is [script, *argv]; sys.path[0] is the script's folder (as for `vastai` itself, not this
  file's: tests/support/ would be importable);
- descriptors 1 and 2 are files of their own for the request (dup2: the vendor's print, its
  logger's StreamHandler bound at import to the sys.stderr object, a subprocess it runs, all land
  there; isatty() is False as on a pipe, so the update nudge and pager stay off as they did);
  descriptor 0 is /dev/null for the whole process (the test ran `vastai` with stdin=DEVNULL:
  `destroy` without -y reads EOF); the JSON lines travel on copies of the original 0 and 1;
- the exit status is SystemExit's code as the interpreter reads it (None: 0, an int: its low 8
  bits, anything else printed on stderr: 1), main()'s return value likewise (sys.exit(main())),
  and any other exception goes through sys.excepthook (the traceback on stderr) with status 1;
- what the one-time import wrote on 1 and 2 (nothing, with 1.9.1) starts every answer's output,
  as every fresh process wrote it.

Module-level state a command sets, and what keeps it from the next command (read in vastai 1.9.1:
cli/main.py, cli/parser.py, cli/util.py, api/client.py, cli/selfupdate.py, the command modules):
- RESET: the parser. cli/main.py builds `parser` at import, the command modules register their
  subcommands on it at import (`@parser.command`), and every main() adds the global options
  (--url, --api-key with $VAST_API_KEY read then, ...) to it and to each subparser: a second main()
  on the same parser fails ("conflicting option string: --url"), and `_process_arguments_with_groups`
  pops `required` from the argument objects. So every module under `vastai` that the one-time
  import did not bring in (vastai.cli.main itself, vastai.cli.commands.*, cli/display, cli/utils,
  cli/selfupdate, cli/self_test, api/metrics, api/price_increase: about 0.1 s of CPU) is dropped
  from sys.modules before each request and imported again by it, as a fresh process imports it:
  the parser, its prog (from sys.argv[0]), the command modules' tables (instances.py's
  _create_instance_args, benchmarks.py's lru_caches and atexit sets) are new each time.
- RESET: os.environ, the working directory, sys.path, signal handlers and the warnings filters and
  once-registries are put back after each request (a command could change them; the ones the
  tests run do not).
- PROVED NOT TO MATTER: the modules the import keeps (vastai, vastai.api.*, vastai.cli.parser,
  vastai.cli.util, vastai.utils, vastai.sdk, vastai.serverless.*, ...): none of their functions
  stores into a module-level name (no `global` but parser.set_completers', which every main()
  calls again with new functions; no item or attribute store into, no mutating method called on,
  a module-level object). What they compute at import comes from the environment this process
  was started with, the test's: cli/util.py's DIRS, APIKEY_FILE, TFAKEY_FILE, ROLE_FILE,
  CACHE_FILE (and the legacy ~/.vast_api_key copy), api/client.py's server_url_default ($VAST_URL),
  the emoji choice from sys.stdout.encoding (a pipe's here as for a fresh `vastai` under
  subprocess), vastai's log level ($VAST_LOG_LEVEL). What a command keeps between runs it keeps
  on disk (the role file, gpu name caches, ssh_<id>.json in DIRS['temp']), as a fresh process does.
- PROVED NOT TO MATTER, per request: HTTP connections (api/client.py makes a requests Session per
  request and never closes it; the garbage collector closes them after each request, as exit
  does: a descriptor still open then is reported in "left"), threads (exec_with_threads joins its
  pool; a thread still alive is reported), atexit handlers (only benchmarks registers one; one
  registered is reported: a fresh process would have run it; weakref.finalize registers its own
  once, at its first use, which urllib3's first pool is: this process makes that use at start).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib.metadata
import json
import os
import re
import signal
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any


def exit_status(code: Any) -> int:
    """The status a process exits with for `sys.exit(code)` (Python's handle_system_exit)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


class Captured:
    """Descriptors 1 and 2 on files of their own while a block runs; `out` and `err` their bytes."""

    def __init__(self, idle_out: int, idle_err: int) -> None:
        self.idle = (idle_out, idle_err)
        self.files = (tempfile.TemporaryFile(), tempfile.TemporaryFile())  # noqa: SIM115  (kept for the process)
        self.out = self.err = b""

    def __enter__(self) -> Captured:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, f in zip((1, 2), self.files, strict=True):
            f.seek(0)
            f.truncate()
            os.dup2(f.fileno(), fd)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):  # a command may have closed or replaced them
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        for fd, idle in zip((1, 2), self.idle, strict=True):
            os.dup2(idle, fd)
        self.out, self.err = (_read(f) for f in self.files)


def _read(f: Any) -> bytes:
    f.seek(0)
    data: bytes = f.read()
    return data


class Driver:
    """The vendor's CLI, imported once; `run(argv)` one command as a fresh `vastai` runs it."""

    def __init__(self, script: str, idle_out: int, idle_err: int) -> None:
        self.script = re.sub(r"(-script\.pyw|\.exe)?$", "", script)  # what the console script sets
        sys.argv = [self.script]
        sys.path[0] = os.path.dirname(script)
        self.streams = (sys.stdout, sys.stderr, sys.stdin)
        self.capture = Captured(idle_out, idle_err)
        with self.capture:
            import vastai.cli.main  # noqa: F401  (the import every request would pay for)
        self.startup = (self.capture.out, self.capture.err)
        weakref.finalize(Captured, lambda: None)  # finalize's one atexit hook, registered at its first use
        self.kept = {name for name in sys.modules if name.startswith("vastai") and name != "vastai.cli.main"}
        self.version = importlib.metadata.version("vastai")

    def _fresh_main(self) -> Callable[[], Any]:
        for name in [n for n in sys.modules if n.startswith("vastai") and n not in self.kept]:
            del sys.modules[name]
        import vastai.cli.main

        main: Callable[[], Any] = vastai.cli.main.main
        return main

    def run(self, argv: list[str]) -> dict[str, Any]:
        env, cwd, path = dict(os.environ), os.getcwd(), list(sys.path)
        handlers = {s: signal.getsignal(s) for s in signal.valid_signals() if signal.getsignal(s) is not None}
        threads, fds, exits = set(threading.enumerate()), _fds(), atexit._ncallbacks()
        sys.argv = [self.script, *argv]
        code = 1
        with self.capture, warnings.catch_warnings():
            warnings.onceregistry.clear()
            try:
                code = exit_status(self._fresh_main()())
            except SystemExit as exc:
                code = exit_status(exc.code)
            except BaseException as exc:  # as the interpreter reports it: from main()'s frame down
                tb = exc.__traceback__.tb_next if exc.__traceback__ else None
                sys.excepthook(type(exc), exc.with_traceback(tb), tb)
                code = 1
            finally:
                sys.stdout, sys.stderr, sys.stdin = self.streams
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.path[:] = path
        for s, h in handlers.items():
            if signal.getsignal(s) is not h:
                signal.signal(s, h)
        gc.collect()  # the requests Sessions and their sockets: what the process's exit would close
        left = [f"thread {t.name}" for t in threading.enumerate() if t not in threads]
        left += [f"descriptor {fd} -> {_link(fd)}" for fd in sorted(_fds() - fds)]
        if atexit._ncallbacks() != exits:
            left.append("an atexit handler")
        out, err = self.startup[0] + self.capture.out, self.startup[1] + self.capture.err
        return {"code": code, "stdout": out.decode("utf-8", "surrogateescape"),
                "stderr": err.decode("utf-8", "surrogateescape"), "left": left}


def _link(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


def serve(script: str) -> None:
    """Hello, then one answer per request line until stdin closes (the module docstring)."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # the commands' stdin: /dev/null, as the test gave a fresh `vastai`
    os.dup2(null, 1)  # between requests: nowhere (the answers have their own copy)
    idle_err = os.dup(2)  # between requests: this process's own stderr (a crash of the driver shows)
    try:
        driver = Driver(script, idle_out=null, idle_err=idle_err)
    except BaseException:
        import traceback

        answers.write(json.dumps({"error": traceback.format_exc()}) + "\n")
        answers.flush()
        raise
    answers.write(json.dumps({"version": driver.version}) + "\n")
    answers.flush()
    for line in requests:
        answers.write(json.dumps(driver.run(list(json.loads(line)["argv"]))) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
