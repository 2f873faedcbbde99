"""`actor-run logs JOB[/SEED] [-f] [--attempt N] [--run ID]`: a job's log, and with `-f` the log as
the job writes it, across retries onto new machines, until the job ends.

How the live log gets here. The controller already reads the new tail of the job's log with every
heartbeat, over the machine's one host connection (actors/heartbeat.py), and appends it to the
seed's `log.txt` in the run's output folder, each attempt opening its part with a header line
(`--- run <run> attempt N on <place> (<when>) ---`); the fetched `log.txt` is that same file once the job
has ended. So `logs` runs in a process of its own and needs no channel into the controller, nor
a second connection to the machine (a cloud's host may allow one): it reads that file, and
`-f` follows it (new bytes every FOLLOW_S; the heartbeat hands them over every couple of seconds,
watch.REPORT_S) while the ledger says the job runs, and ends when the ledger records its end.
A controller that dies meanwhile (killed; its machines' watchdogs end the jobs) ends `-f` too,
saying so, exit 1.

A job's bytes are printed inert: each control character but tab, newline and carriage return is
shown as its escape (`\\x1b`), so a job's OSC 52 (clipboard), clear-screen or title sequence never
reaches the terminal, whether stdout is one or a pipe (`| less -R` would obey them). `--raw` writes
the bytes as they are, to a pipe or a file only (exit 2 on a terminal).

Which part of `log.txt` is the run's: a seed folder may hold the log of an earlier run into the
same output folder; the parts whose header time falls within the run (its start to its end, or
to the next run's start) are shown.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actor_run.protocols.specs import MAX_ATTEMPTS
from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, count_arg, open_reader, usage_error
from actor_run.supervisors.ledger import LedgerReader, RunRow
from actor_run.supervisors.ledger.db import read_failures
from actor_run.supervisors.views.text import visible

HELP = "print a job's log; -f follows it as the job writes it, across retries, until the job ends"
EXAMPLE = """example:
  actor-run logs train/3 -f             # seed 3 of job "train", in the latest run that has it
  actor-run logs train --attempt 1      # a job of one seed; only its second attempt
  actor-run logs train/seed-3 --run 3f2a9c1d
"""
FOLLOW_S = 0.2  # how often -f looks for new bytes
LEDGER_S = 0.5  # how often -f asks the ledger whether the job has ended
# `--- run 3f2a9c1d attempt 1 on ...`; logs written before the run was named have no `run <id> `
HEADER = re.compile(rb"^--- (?:run \S+ )?attempt (\d+) on .*\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\) ---$",
                    re.MULTILINE)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("logs", help=HELP, description=HELP, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB[/SEED]", help="the job's name, and its seed when it has more than one")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing as the job writes, until it ends")
    p.add_argument("--attempt", type=count_arg(0, MAX_ATTEMPTS), help="only this attempt (numbered from 0)")
    p.add_argument("--run", help="the run (default: the latest run that has this job; see `actor-run runs`)")
    p.add_argument("--raw", action="store_true",
                   help="the log's bytes as they are, escape sequences too (to a pipe or a file only; without it "
                        "control characters are shown as \\x1b)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def parse_target(text: str) -> tuple[str, int | None]:
    """`train/3` or `train/seed-3` -> ("train", 3); `train` -> ("train", None). ValueError if malformed."""
    name, slash, seed = text.partition("/")
    if not name:
        raise ValueError("expected JOB or JOB/SEED")
    if not slash:
        return name, None
    seed = seed.removeprefix("seed-")
    if not re.fullmatch(r"-?\d+", seed):
        raise ValueError(f"the seed must be a number, got {seed!r}")
    return name, int(seed)


class Part:
    """One attempt's part of log.txt: from its header to the next header."""

    def __init__(self, attempt: int | None, began: float, start: int) -> None:
        self.attempt, self.began, self.start = attempt, began, start


def parts(data: bytes) -> list[Part]:
    """The file cut at its attempt headers (what comes before the first is a part of its own)."""
    found = [Part(None, 0.0, 0)]
    for m in HEADER.finditer(data):
        began = time.mktime(time.strptime(m.group(2).decode(), "%Y-%m-%d %H:%M:%S"))
        found.append(Part(int(m.group(1)), began, m.start()))
    return found


class Selection:
    """Which parts of log.txt are printed: those of the run (by the header's time, to the second),
    and of one attempt when asked."""

    def __init__(self, since: float, until: float | None, attempt: int | None) -> None:
        self.since, self.until, self.attempt = since - 1.0, until, attempt

    def wants(self, part: Part) -> bool:
        if part.attempt is None:
            return False  # before any header: nothing of an attempt
        if part.began < self.since or (self.until is not None and part.began > self.until + 1.0):
            return False
        return self.attempt is None or part.attempt == self.attempt

    def cut(self, data: bytes, current: Part | None = None) -> tuple[bytes, Part | None]:
        """What of `data` (whole lines of the file) is printed; `current` is the part the bytes before
        `data` ended in (None: `data` is the file from its start). Returns the bytes to print and the
        part `data` ends in."""
        out = bytearray()
        pieces = parts(data)
        if current is not None:
            pieces[0] = current  # what comes before the first header here continues that part
        for i, part in enumerate(pieces):
            start = 0 if i == 0 else part.start
            end = pieces[i + 1].start if i + 1 < len(pieces) else len(data)
            if self.wants(part):
                out += data[start:end]
        return bytes(out), pieces[-1]


def _choose(reader: LedgerReader, name: str, seed: int | None, run_id: str | None) -> tuple[RunRow, dict[str, Any]]:
    """The run and the job row `logs` shows; ValueError saying what is wrong."""
    runs = reader.runs()
    if run_id is not None:
        runs = [r for r in runs if r.id == run_id]
        if not runs:
            raise ValueError(f"--run: no run {run_id!r} in this ledger (see `actor-run runs`)")
    for run in sorted(runs, key=lambda r: (r.started or 0.0), reverse=True):
        jobs = [j for j in reader.jobs(run.id) if j["name"] == name]
        if seed is not None:
            jobs = [j for j in jobs if j["seed"] == seed]
        if len(jobs) == 1:
            return run, jobs[0]
        if len(jobs) > 1:
            seeds = ", ".join(str(j["seed"]) for j in jobs)
            raise ValueError(f"job: {name} has seeds {seeds} in run {run.id}: name one, e.g. {name}/{jobs[0]['seed']}")
    where = f"run {run_id}" if run_id else "any run of this ledger"
    raise ValueError(f"job: no job {name}{'' if seed is None else f'/{seed}'} in {where}")


def cmd_logs(args: argparse.Namespace) -> int:
    try:
        name, seed = parse_target(args.job)
    except ValueError as exc:
        return usage_error(f"JOB[/SEED]: {exc}")
    if args.attempt is not None and args.attempt < 0:
        return usage_error(f"--attempt: expected int >= 0, got {args.attempt}")
    if args.raw and sys.stdout.isatty():
        return usage_error("--raw: writes the job's escape sequences as they are: only to a pipe or a file, "
                           "never to a terminal")
    reader = open_reader(args)
    try:
        try:
            run, job = _choose(reader, name, seed, args.run)
        except ValueError as exc:
            return usage_error(str(exc))
        if args.attempt is not None and (not args.follow or job["state"] != "running"):
            made = sorted(a["attempt"] for a in reader.attempts(run.id) if a["job"] == job["key"])
            if args.attempt not in made:
                have = f"attempt(s) {', '.join(map(str, made))}" if made else "no attempts"
                sys.stderr.write(f"actor-run: --attempt {args.attempt}: {job['key']} has {have} in run {run.id}\n")
                return Exit.FAILED
        later = [r.started for r in reader.runs() if (r.started or 0.0) > (run.started or 0.0) and r.started]
        until = run.ended if run.ended else (min(later) if later else None)
        selection = Selection(run.started or 0.0, until, args.attempt)
        path = Path(job["out_dir"]) / "log.txt"
        out = sys.stdout.buffer
        # a job's bytes reach a terminal (or a pipe a terminal reads) inert: --raw for them as they are
        write: Callable[[bytes], Any] = out.write if args.raw else (lambda data: out.write(visible(data)))
        if not args.follow:
            data = path.read_bytes() if path.exists() else b""
            write(selection.cut(data)[0])
            out.flush()
            return Exit.OK
        return follow(path, selection, write, out.flush,
                      lambda: _still_running(reader, run.id, job["key"], job["owner"]))
    finally:
        reader.close()


def _still_running(reader: LedgerReader, run: str, key: str, owner: str) -> str:
    """'running', 'ended', or 'orphaned' (its controller is gone with the job unfinished). A queued
    job (a shared ledger's, waiting for a worker) is 'running': -f waits for it to start. On a
    shared ledger an orphan is 'running' too: a worker adopts it within its lease and one poll. A
    read the database could not answer (restarting) is 'running': the next one asks again."""
    try:
        rows = [j for j in reader.jobs(run) if j["key"] == key]
        if rows and rows[0]["state"] == "queued":
            return "running"
        if not rows or rows[0]["state"] != "running":
            return "ended"
        if not reader.backend.fenced and rows[0]["owner"] not in reader.live_owners():
            return "orphaned"
    except read_failures(reader.backend):
        return "running"
    return "running"


def follow(path: Path, selection: Selection, write: Callable[[bytes], Any], flush: Callable[[], None],
           state: Callable[[], str]) -> int:
    """Print `path` as it grows (whole lines), until `state()` says the job has ended (then what is
    left, and exit 0) or that its controller is gone (exit 1)."""
    offset, current, asked = 0, None, float("-inf")
    while True:
        ended = None
        if time.monotonic() - asked >= LEDGER_S:
            asked = time.monotonic()
            ended = state()  # asked before the read: what the job wrote before it ended is in the file by then
        if path.exists():
            with open(path, "rb") as f:
                if f.seek(0, 2) < offset:  # the file was replaced: from its start again
                    offset, current = 0, None
                f.seek(offset)
                data = f.read()
            whole = len(data) if ended in ("ended", "orphaned") else data.rfind(b"\n") + 1
            if whole:
                text, current = selection.cut(data[:whole], current)
                offset += whole
                if text:
                    write(text)
                    flush()
        if ended == "ended":
            return Exit.OK
        if ended == "orphaned":
            sys.stderr.write("actor-run: the controller running this job is gone; `actor-run resume` takes the job"
                             " over (then `actor-run logs -f` again)\n")
            return Exit.FAILED
        time.sleep(FOLLOW_S)
