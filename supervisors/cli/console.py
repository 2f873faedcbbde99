"""What the CLI's commands share: exit codes, the Ctrl-C handler, watching jobs to their end, and
which ledger a command reads. No command lives here (each is a `cmd_*` module); this module
imports neither the CLI nor a command, so any of them may import it."""

from __future__ import annotations

import argparse
import collections
import contextlib
import enum
import importlib.util
import logging
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, cast

from actor_run.protocols.logs import ROOT as LOGGER_ROOT
from actor_run.protocols.messages import Event, JobEnded, Released
from actor_run.protocols.redact import redact
from actor_run.protocols.specs import job_key
from actor_run.supervisors.api.places import default_ledger_path
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.ledger.db import resolve as resolve_ledger
from actor_run.supervisors.views.text import printable

if TYPE_CHECKING:  # a command that reads the ledger loads neither the Runner nor the live view
    import importlib.abc
    import importlib.machinery

    from actor_run.supervisors.api.runner import Runner

LEDGER_HELP = ("the ledger: a SQLite file or a postgresql:// URL (default: $ACTOR_RUN_LEDGER, else "
               "<state>/ledger.sqlite)")


def where_state_lives() -> str:
    """What `run --help` says of the state folder and the default ledger."""
    return (f"state (the ledger, pinned host keys, the local and sim clouds' sandboxes) lives in <state> = "
            f"{default_ledger_path().parent} (under $XDG_STATE_HOME when set); the ledger is <state>/ledger.sqlite "
            "unless --ledger or $ACTOR_RUN_LEDGER names another")


def number_arg(least: float, most: float, *, strict: bool = False) -> Callable[[str], float]:
    """An argparse `type`: a finite number from `least` (above it when `strict`) to `most`; argparse
    says which flag in one line and exits 2 otherwise (`--grace nan`, `--grace -1`, `--grace inf`)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or not (value > least if strict else value >= least) or value > most:
            raise argparse.ArgumentTypeError(
                f"expected a finite number {'>' if strict else '>='} {least:g} and <= {most:,.0f}, got {text!r}")
        return value
    return parse


def count_arg(least: int, most: int) -> Callable[[str], int]:
    """An argparse `type`: an int from `least` to `most` (exit 2 naming the flag otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected int >= {least}, got {value}")
        if value > most:
            raise argparse.ArgumentTypeError(f"expected int <= {most:,}, got {value}")
        return value
    return parse


class Exit(enum.IntEnum):
    OK = 0  # every job succeeded
    FAILED = 1  # some job failed
    USAGE = 2  # bad input or usage; nothing started
    CANCELED = 3  # no job failed, but some were canceled from elsewhere (`actor-run cancel`, Runner.cancel)
    UNCONFIRMED = 4  # no job failed, but a machine's deletion could not be proven (`actor-run sweep` finishes it)
    INTERRUPTED = 130  # after a Ctrl-C whose cleanup finished


def exit_of(ended: list[JobEnded]) -> Exit:
    """The exit code of jobs that ended so: 1 if one failed, else 3 if one was canceled, else 0."""
    outcomes = {e.outcome for e in ended}
    if outcomes <= {"succeeded"}:
        return Exit.OK
    return Exit.CANCELED if outcomes <= {"succeeded", "canceled"} else Exit.FAILED


_stderr_sink: list[int] = []  # loguru's id of the stderr handler (watch() lends stderr to the live view)


def _clean(record: Any) -> None:
    # no secret value this process knows; no terminal control sequence from a name
    record["message"] = printable(redact(record["message"]))


def _line_format(record: Any) -> str:
    """A WARNING line names its job when it is about one."""
    _clean(record)
    job = record["extra"].get("job")
    return "{time:HH:mm:ss} {level} " + ("{extra[job]}: " if job and job != "-" else "") + "{message}\n{exception}"


def _view_format(record: Any) -> str:
    _clean(record)
    return "{message}"


def _shown(record: Any) -> bool:
    return not record["extra"].get("traceback")  # a crash's traceback goes to the run's log file only


def _configure(loguru: ModuleType) -> None:
    logger = loguru.logger
    logger.remove()
    _stderr_sink.clear()
    # no variable values in tracebacks: a job's environment may hold a secret
    _stderr_sink.append(logger.add(sys.stderr, level="WARNING", format=_line_format, filter=_shown, backtrace=False,
                                   diagnose=False))


class _ThenLoader:
    """A module's own loader, then `then(module)` once the module has run (the way
    importlib.util.LazyLoader wraps a loader). Neither this nor the finder below derives from
    importlib.abc's classes: the import system only calls their methods, and importlib.abc loads
    importlib.resources (tempfile, shutil: about 20 ms of CPU in every command)."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)


class _ConfigureOnImport:
    """Set loguru up as whoever needs it first imports it (then this finder leaves sys.meta_path)."""

    def find_spec(self, fullname: str, path: Any,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "loguru":
            return None
        _stop_waiting()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = cast("importlib.abc.Loader", _ThenLoader(spec.loader, _configure))  # duck-typed: see above
        return spec


def _stop_waiting() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ConfigureOnImport)]


def stderr_lines_off() -> None:
    """No more WARNING lines on stderr (a detached controller, whose stderr is its run's log: the
    log has them already, from `open_run_log`)."""
    if _stderr_sink and "loguru" in sys.modules:
        sys.modules["loguru"].logger.remove(_stderr_sink.pop())
_STANDARD = frozenset((*logging.LogRecord("", 0, "", 0, "", (), None).__dict__, "message", "asctime", "taskName"))


class _ToLoguru(logging.Handler):
    """actor-run's records (stdlib `logging` under `actor_run`: protocols/logs.py) into loguru with
    their fields bound, so the CLI's sinks (stderr, the live view's fold, controller.log) show them
    as they always have. loguru is imported at the first record (then configured: `configure_logging`)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from loguru import logger

            extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD}
            bound = logger.bind(**extra)
            if record.exc_info:
                bound = bound.opt(exception=record.exc_info)
            bound.log(record.levelname, record.getMessage())  # no arguments: loguru leaves the text as it is
        except Exception:  # logging's own rule: a handler that fails reports it and lets the caller go on
            self.handleError(record)


def forward_to_loguru() -> None:
    """Route the `actor_run` logger tree's records (INFO and up: controller.log's level) into loguru
    (idempotent). The library itself only logs through stdlib `logging` and prints nothing."""
    tree = logging.getLogger(LOGGER_ROOT)
    if not any(isinstance(h, _ToLoguru) for h in tree.handlers):
        tree.addHandler(_ToLoguru())
    if tree.level == logging.NOTSET or tree.level > logging.INFO:
        tree.setLevel(logging.INFO)


def configure_logging() -> None:
    """WARNING lines on stderr, one format, secrets redacted; actor-run's stdlib records forwarded
    into loguru. loguru costs about 0.1 s of CPU to import (it imports asyncio) and most commands
    log nothing: it is set up now if it is loaded, else as it is first imported (the first record)."""
    forward_to_loguru()
    _stop_waiting()
    if "loguru" in sys.modules:
        _configure(sys.modules["loguru"])
    else:
        sys.meta_path.insert(0, _ConfigureOnImport())


# the signals that stop a controller: Ctrl-C, `kill`, and its terminal closing (SIGHUP: a closed
# window, a dropped SSH session); each deletes every machine before it exits
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def on_stop(handler: Callable[[int, FrameType | None], Any], *, hangup: bool = True) -> None:
    """`handler` for each of STOPS, on the main thread (inside `signals_restored`, which puts them
    back). On SIGHUP, first the standard streams that were a terminal are pointed at /dev/null: a
    hung-up terminal fails every write (EIO), and a write that raised would end the cleanup early
    (what the controller says still goes to the run's log). `hangup=False` (a detached controller,
    which has no terminal to lose): SIGHUP is ignored instead."""
    ttys = [fd for fd in (0, 1, 2) if _isatty(fd)]  # now: a hung-up terminal no longer says it is one

    def hung_up(signum: int, frame: FrameType | None) -> None:
        _to_devnull(ttys)
        handler(signum, frame)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, hung_up if hangup else signal.SIG_IGN)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _to_devnull(fds: list[int]) -> None:
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)


def say(text: str) -> None:
    """`text` on stderr from a signal handler: a stream that fails (a closed terminal, a closed
    pipe) loses the line, never the handler's work."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError, RuntimeError):  # RuntimeError: its own write, cut by the signal, entered again
        pass


def interrupted() -> int:
    """A Ctrl-C that reached no handler of a command's (a prompt, a follow loop, an import): one
    line on stderr, no traceback; the interrupted exit code."""
    say(("\n" if _isatty(2) else "") + "actor-run: interrupted\n")
    return Exit.INTERRUPTED


class Interrupts:
    """First Ctrl-C (or SIGTERM, or SIGHUP: the terminal closed): cancel everything (machines are
    deleted). Later ones: say we are still deleting."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            why = "the terminal closed (SIGHUP); " if signum == signal.SIGHUP else ""
            say(f"\nactor-run: {why}canceling; deleting every machine before exiting (Ctrl-C again will not skip it)\n")
            self.runner.cancel(detail="interrupted")
        else:
            say("actor-run: still deleting machines; the controller exits once they are gone\n")


@contextlib.contextmanager
def signals_restored() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP back to whoever had them once the block (a run and its cleanup)
    ends: a command run in a process that goes on (an embedder's, a test's) leaves it its own Ctrl-C."""
    previous = {s: signal.getsignal(s) for s in STOPS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is not None:  # None: set outside Python, not ours to put back
                signal.signal(s, handler)


def watch(runner: Runner, keys: list[str], events: collections.deque[Event], *, json_mode: bool,
          unconfirmed: list[Released] | None = None, budget_usd: float | None = None) -> list[JobEnded]:
    """Show the jobs `keys` until each has ended (the live view on a terminal, a line per change
    otherwise, or with `json_mode` one event per line carrying its run); their JobEnded events, in
    the order of `keys`. `events` is what the Runner's subscriber `events.append` fills."""
    from loguru import logger

    from actor_run.supervisors.views.live import View  # rich: only where a run is watched

    ended: dict[str, JobEnded] = {}
    unconfirmed = [] if unconfirmed is None else unconfirmed

    def until(e: Event) -> bool:
        if isinstance(e, JobEnded):
            ended[job_key(e.job, e.seed)] = e
        if isinstance(e, Released) and not e.confirmed:
            unconfirmed.append(e)
        return len(ended) >= len(keys)

    with View(keys, json_mode=json_mode, run_of=runner.run_of, budget_usd=budget_usd,
              budget=runner.budget.statistics) as view:
        lent = view.live is not None and bool(_stderr_sink)
        if lent:  # WARNING lines fold into the frame while it is on the screen (views/log_warnings.py)
            logger.remove(_stderr_sink.pop())
            sink = logger.add(view.warn, level="WARNING", format=_view_format, filter=_shown, backtrace=False,
                              diagnose=False)
        try:
            view.follow(events, until)
        finally:
            if lent:
                logger.remove(sink)
                _stderr_sink.append(logger.add(sys.stderr, level="WARNING", format=_line_format, filter=_shown,
                                               backtrace=False, diagnose=False))
    view.summary()
    for line in view.warnings.summary():
        sys.stderr.write(line + "\n")
    for r in unconfirmed:
        sys.stderr.write(
            f"actor-run: unconfirmed: machine {r.machine} could not be confirmed deleted ({r.detail}); it stays in the "
            "ledger for "
            f"`actor-run sweep`; to delete it by hand, delete the machine named {r.machine}"
            " in its provider's console\n")
    return [ended[k] for k in keys]


def ledger_path(args: argparse.Namespace) -> Path | str:
    """The ledger a command uses: --ledger, else $ACTOR_RUN_LEDGER, else the one in the state
    folder (a file's path, or a postgresql:// URL)."""
    return resolve_ledger(args.ledger, Path(args.state_dir) if args.state_dir else default_ledger_path().parent)


def open_reader(args: argparse.Namespace) -> LedgerReader:
    """The ledger, opened read-only: a reading command (status, runs, cost, logs, report, ...) makes
    no folder or file. A path named (--ledger, $ACTOR_RUN_LEDGER) that is no ledger is
    LedgerUnusable (exit 2, naming it); the default ledger not made yet reads as empty."""
    import os

    from actor_run.supervisors.ledger.db import ENV

    named = bool(getattr(args, "ledger", None)) or bool(os.environ.get(ENV))
    return LedgerReader(ledger_path(args), read_only=True, missing_ok=not named)


def usage_error(message: str) -> int:
    """One line on stderr naming what is wrong; the usage exit code."""
    sys.stderr.write(f"actor-run: {message}\n")
    return Exit.USAGE
