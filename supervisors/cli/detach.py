"""`actor-run run BATCH --detach`: the run's controller in a process of its own that outlives the
terminal, and this process back to the shell within seconds.

Two processes. The one the user started (the *parent*) checks what it can alone (the batch file
or flags, --concurrency, the `[y/N]` question on a terminal), chooses the run's id, opens the
run's controller log (`<state>/runs/<run>/controller.log`, views/runlog.py) and starts the
*controller*: `python -m actor_run` with the same arguments and two hidden ones (`--detached-run
RUN`, `--ready-fd FD`), in a session of its own (setsid: no terminal, so no SIGHUP when the
terminal closes; it ignores SIGHUP anyway), stdin from /dev/null, stdout and stderr appended to
that log. The controller is an `actor-run run` like any other: its owner row in the ledger holds
its pid (ledger/owners.py), which is how `cancel`, `sweep` and `resume` tell it is alive, and its
machines are deleted on its way out as any controller's are. It never reads a terminal (no
question, no live view).

The parent waits, up to READY_S, for one line on a pipe the controller holds (`--ready-fd`):
`ok RUN` once every job is checked (the same `Runner.check` a foreground run makes: a typo in a
GPU name is still exit 2, one line) and submitted; `usage MESSAGE` for bad input found there. It
then prints the run's id and the commands that watch and stop it, and exits. A controller that
ends before saying anything is exit 1, naming its log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from actor_run.protocols.files import private_opener
from actor_run.protocols.specs import Batch
from actor_run.supervisors.api.places import new_run_id
from actor_run.supervisors.cli.console import Exit, ledger_path, say
from actor_run.supervisors.ledger import LedgerError, LedgerReader
from actor_run.supervisors.views.runlog import run_log_path

READY_S = 300.0  # how long the parent waits for the controller's word (a cloud's check may take 120 s)
EXIT_WAIT_S = 10.0  # how long it waits for a controller that said no to exit (for its exit code)


def add_flags(run: argparse.ArgumentParser) -> None:
    run.add_argument("--detach", action="store_true",
                     help="run the controller in the background (it outlives this terminal): print the run's id "
                          "and the commands to watch it, and exit")
    run.add_argument("--detached-run", help=argparse.SUPPRESS)  # the controller's side: its run's id
    run.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # where it says `ok RUN` or why not


def is_controller(args: argparse.Namespace) -> bool:
    """Whether this process is a detached run's controller (started by `start`)."""
    return getattr(args, "detached_run", None) is not None


def start(args: argparse.Namespace, batch: Batch) -> int:
    """The parent's side: start the controller, wait for its word, print how to follow the run.
    The batch was loaded (and the question asked) by the caller. Exit code: 0 started, 2 bad input
    (the controller's one line), 1 the controller ended first, 130 interrupted (the controller, if
    it started, goes on)."""
    run = _free_run_id(args)
    log = run_log_path(args.state_dir, run)
    log.parent.mkdir(parents=True, exist_ok=True)
    out = private_opener(str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "actor_run", *_controller_argv(args.argv, run, write_end)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=(write_end,),
                                start_new_session=True)
    finally:
        os.close(out)
        os.close(write_end)  # the controller holds the only write end: EOF when it has said its word or ended
    try:
        word = _read_word(read_end, READY_S)
    except KeyboardInterrupt:
        say(f"\nactor-run: interrupted; run {run}'s controller (pid {proc.pid}) may have started: "
            f"actor-run cancel {run}{_ledger_hint(args)} stops it\n")
        return Exit.INTERRUPTED
    finally:
        os.close(read_end)
    kind, _, rest = (word or "").partition(" ")
    if kind == "usage":
        _reap(proc)
        _forget(log)  # no run was recorded: no folder of one either
        sys.stderr.write(f"actor-run: {rest}\n")
        return Exit.USAGE
    if kind == "ok":
        run = rest or run  # the id it recorded (another one only if this one was taken meanwhile)
    elif word is None:  # no word yet after READY_S: it goes on
        say(f"actor-run: run {run}'s controller is still starting after {READY_S:.0f} s; it goes on in the "
            f"background (its log: {log})\n")
    else:
        code = _reap(proc)
        said = _last_said(log)
        if code == Exit.USAGE and said:  # bad input it found outside the run (a ledger that is no ledger)
            _forget(log)
            sys.stderr.write(said + "\n")
            return Exit.USAGE
        sys.stderr.write(f"actor-run: the run's controller ended before starting it (exit {code}); its log: {log}\n")
        return Exit.FAILED
    _tell(args, batch, run, proc.pid, log)
    return Exit.OK


def _tell(args: argparse.Namespace, batch: Batch, run: str, pid: int, log: Path) -> None:
    jobs = batch.jobs()
    out_dir = Path(args.out).expanduser().resolve()
    hint = _ledger_hint(args)
    if args.json:
        sys.stdout.write(msgspec.json.encode({"run": run, "pid": pid, "jobs": len(jobs), "out": str(out_dir),
                                              "log": str(log)}).decode() + "\n")
        return
    first = f"{jobs[0].name}/{jobs[0].seed}" if jobs else "JOB/SEED"
    print(f"run {run}: {len(jobs)} job(s), results in {out_dir}\n"
          f"its controller runs in the background (pid {pid}); its log: {log}\n"
          f"  follow it:     actor-run status --follow --run {run}{hint}\n"
          f"  a job's log:   actor-run logs {first} -f --run {run}{hint}\n"
          f"  stop it:       actor-run cancel {run}{hint}", flush=True)


def _ledger_hint(args: argparse.Namespace) -> str:
    return f" --ledger {shlex.quote(str(args.ledger))}" if args.ledger else ""


def _free_run_id(args: argparse.Namespace) -> str:
    """A new run id the ledger does not hold yet (the controller records it)."""
    location = ledger_path(args)
    taken: set[str] = set()
    if isinstance(location, Path) and location.exists():
        try:
            reader = LedgerReader(location)
            try:
                taken = {r.id for r in reader.runs()}
            finally:
                reader.close()
        except LedgerError:
            pass  # the controller opens it too, and says what is wrong with it
    run = new_run_id()
    while run in taken:
        run = new_run_id()
    return run


def _controller_argv(argv: list[str], run: str, fd: int) -> list[str]:
    """The user's arguments and the controller's two hidden ones (before `--`: they are `run`'s)."""
    hidden = ["--detached-run", run, "--ready-fd", str(fd)]
    if "--" in argv:
        cut = argv.index("--")
        return [*argv[:cut], *hidden, *argv[cut:]]
    return [*argv, *hidden]


def _read_word(fd: int, timeout: float) -> str | None:
    """The controller's line (`ok RUN`, `usage MESSAGE`; "" if it ended without one), or None if
    `timeout` passed first."""
    data = b""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return data.decode(errors="replace").partition("\n")[0].strip()
        data += chunk
    return None


def _forget(log: Path) -> None:
    """The log folder of a run that never started, unless something else is in it."""
    with contextlib.suppress(OSError):
        log.unlink()
        log.parent.rmdir()


def _last_said(log: Path) -> str:
    """The last `actor-run: ...` line the controller wrote to its log ("" if none)."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-50:]
    except OSError:
        return ""
    return next((line for line in reversed(lines) if line.startswith("actor-run: ")), "")


def _reap(proc: subprocess.Popen[bytes]) -> int | str:
    try:
        return proc.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return "still running"


# --- the controller's side ---------------------------------------------------------------------------


class Word:
    """The controller's one line to the parent, said once (`ok` or `usage`), then the pipe closed.
    The parent may be gone (its terminal closed, its shell killed): a pipe with no reader loses the
    word, never the run."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        if fd is not None:
            os.set_inheritable(fd, False)  # the jobs' processes never hold it (the parent waits for EOF)

    def say(self, kind: str, text: str) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.write(fd, f"{kind} {text}".replace("\n", " ").encode()[:4000] + b"\n")
        except OSError:
            pass
        finally:
            os.close(fd)


def become_controller(args: argparse.Namespace) -> Word:
    """The first thing a detached controller does: SIGHUP ignored (it has no terminal; a stray one
    is no stop), and the pipe to its parent."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with contextlib.suppress(AttributeError, ValueError):  # a line per change as it happens, in the log
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    return Word(args.ready_fd)


__all__ = ["Word", "add_flags", "become_controller", "is_controller", "start"]
