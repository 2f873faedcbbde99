"""The `actor-run` command: parses, builds specs, calls the Runner, renders. Nothing else.

    actor-run run BATCH.toml [--json] [--concurrency N] [--ledger PATH] [--out DIR]
    actor-run status [--json] [--ledger PATH]
    actor-run sweep [--json] [--dry-run] [--ledger PATH]
    actor-run resume [--json] [--ledger PATH] [--out DIR]
"""

from __future__ import annotations

import argparse
import collections
import enum
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec
from loguru import logger

from actor_run.protocols.clouds import known_clouds
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Event, JobEnded, Released
from actor_run.protocols.specs import job_key, load_batch
from actor_run.supervisors.gc_tuning import tune_gc
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.runner import Runner, default_ledger_path, default_state_dir
from actor_run.supervisors.view import View, budget_of


class Exit(enum.IntEnum):
    OK = 0  # every job succeeded
    FAILED = 1  # some job failed
    USAGE = 2  # bad input or usage; nothing started
    INTERRUPTED = 130  # after a Ctrl-C whose cleanup finished


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2
        sys.stderr.write(f"actor-run: {message}\n")
        raise SystemExit(Exit.USAGE)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="actor-run", description="Run GPU jobs on rented machines, in attempts.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a batch file")
    run.add_argument("batch")
    run.add_argument("--json", action="store_true", help="one event per line (JSON)")
    run.add_argument("--concurrency", type=int)
    run.add_argument("--ledger")
    run.add_argument("--out", default="actor-run-out")
    run.add_argument("--state-dir", help=argparse.SUPPRESS)
    for name in ("status", "sweep", "resume"):
        s = sub.add_parser(name)
        s.add_argument("--json", action="store_true")
        s.add_argument("--ledger")
        s.add_argument("--state-dir", help=argparse.SUPPRESS)
        if name == "sweep":
            s.add_argument("--dry-run", action="store_true")
            s.add_argument("--grace", type=float, default=600.0,
                           help="seconds past a deadline before any owner's machine goes")
        if name == "resume":
            s.add_argument("--out", default="actor-run-out")
    return p


def _configure_logging() -> None:
    logger.remove()
    # no variable values in tracebacks: a job's environment may hold a secret
    logger.add(sys.stderr, level="WARNING", format="{time:HH:mm:ss} {level} {message}", backtrace=False,
               diagnose=False)


class _Interrupts:
    """First Ctrl-C: cancel everything (machines are deleted). Later ones: say we are still deleting."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.count = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            sys.stderr.write("\nactor-run: canceling; deleting every machine before exiting"
                             " (Ctrl-C again will not skip it)\n")
            self.runner.cancel(detail="interrupted")
        else:
            sys.stderr.write("actor-run: still deleting machines; the controller exits once they are gone\n")


def cmd_run(args: argparse.Namespace) -> int:
    try:
        batch = load_batch(args.batch, known_clouds())
        if args.concurrency is not None and args.concurrency < 1:
            raise SpecError("--concurrency", f"expected int >= 1, got {args.concurrency}")
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    jobs = batch.jobs()
    concurrency = args.concurrency or batch.spec.policy.concurrency
    events: collections.deque[Event] = collections.deque()
    runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir, concurrency=concurrency,
                    budget_usd=batch.spec.policy.budget_usd)
    interrupts = _Interrupts(runner)
    unconfirmed: list[Released] = []
    try:
        with runner:
            for job in jobs:
                runner.check(job)  # every job checked before any starts
            runner.subscribe(events.append)
            previous = signal.signal(signal.SIGINT, interrupts)
            signal.signal(signal.SIGTERM, interrupts)
            ended = _watch(runner, [runner.submit(j).key for j in jobs], events, json_mode=args.json,
                           unconfirmed=unconfirmed, budget_usd=batch.spec.policy.budget_usd)
        signal.signal(signal.SIGINT, previous)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    if interrupts.count:
        return Exit.INTERRUPTED
    if unconfirmed:
        return Exit.FAILED  # a machine may still be running (and billing): not a clean success
    return Exit.OK if all(e.outcome == "succeeded" for e in ended) else Exit.FAILED


def _watch(runner: Runner, keys: list[str], events: collections.deque[Event], *, json_mode: bool,
           unconfirmed: list[Released] | None = None, budget_usd: float | None = None) -> list[JobEnded]:
    ended: dict[str, JobEnded] = {}
    unconfirmed = [] if unconfirmed is None else unconfirmed

    def until(e: Event) -> bool:
        if isinstance(e, JobEnded):
            ended[job_key(e.job, e.seed)] = e
        if isinstance(e, Released) and not e.confirmed:
            unconfirmed.append(e)
        return len(ended) >= len(keys)

    with View(keys, json_mode=json_mode, budget_usd=budget_usd, budget=budget_of(runner)) as view:
        view.follow(events, until)
    view.summary()
    for r in unconfirmed:
        sys.stderr.write(
            f"actor-run: machine {r.machine} could not be confirmed deleted ({r.detail}); it stays in the ledger for "
            f"`actor-run sweep`; to delete it by hand, delete the machine named {r.machine}"
            " in its provider's console\n")
    return [ended[k] for k in keys]


def _reader(args: argparse.Namespace) -> LedgerReader:
    path = Path(args.ledger).expanduser() if args.ledger else (
        Path(args.state_dir) / "ledger.sqlite" if args.state_dir else default_ledger_path())
    return LedgerReader(path)


def cmd_status(args: argparse.Namespace) -> int:
    reader = _reader(args)
    try:
        rows = reader.machines()
        live = reader.live_owners()
    finally:
        reader.close()
    if args.json:
        for r in rows:
            d = msgspec.structs.asdict(r)
            d["owner_alive"] = r.owner in live
            sys.stdout.write(msgspec.json.encode(d).decode() + "\n")
        return Exit.OK
    alive = [r for r in rows if r.state == "alive"]
    if not alive:
        print(f"no machine alive ({len(rows)} in the ledger, all deleted)")
        return Exit.OK
    print(f"{'machine':<52} {'cloud':<6} {'phase':<14} {'owner':<9} deadline")
    for r in alive:
        owner = r.owner[:8] + ("" if r.owner in live else " (gone)")
        deadline = time.strftime("%H:%M:%S", time.localtime(r.deadline))
        print(f"{r.name:<52} {r.cloud:<6} {r.phase:<14} {owner:<9} {deadline}")
    return Exit.OK


def cmd_sweep(args: argparse.Namespace) -> int:
    runner = Runner(ledger=args.ledger, state_dir=args.state_dir, sweep_on_start=False, sweep_grace_s=args.grace)
    with runner:
        actions = runner.sweep(dry_run=args.dry_run)
    failed = False
    for a in actions:
        if args.json:
            sys.stdout.write(msgspec.json.encode(a).decode() + "\n")
        elif a.action != "keep" or not args.dry_run:
            verb = {"delete": "would delete"}.get(a.action, a.action)
            print(f"{a.machine:<52} {a.cloud:<6} {verb:<13} {a.reason}{': ' + a.detail if a.detail else ''}")
        if a.action == "failed":
            failed = True
            if a.machine == "*":
                sys.stderr.write(f"actor-run: could not list the machines on {a.cloud} ({a.detail}): any of ours there "
                                 "were not swept; run the sweep again once it answers\n")
            else:
                sys.stderr.write(f"actor-run: could not delete {a.machine} on {a.cloud}: {a.detail}; it stays in the "
                                 "ledger for the next sweep; delete it by hand in the provider's console if this "
                                 "persists\n")
    if not args.json and not any(a.action != "keep" for a in actions):
        print("nothing to sweep")
    return Exit.FAILED if failed else Exit.OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _configure_logging()
    if args.state_dir is None:
        args.state_dir = str(default_state_dir())
    if args.command == "run":
        return cmd_run(args)
    if args.command == "status":
        return cmd_status(args)
    if args.command == "sweep":
        return cmd_sweep(args)
    if args.command == "resume":
        from actor_run.supervisors.resume import cmd_resume

        return cmd_resume(args)
    return Exit.USAGE


def entry() -> None:
    """The `actor-run` console script: this process is ours, so the collector is set for batches
    of thousands of attempts (gc_tuning.py) before the command runs."""
    tune_gc()
    sys.exit(main())

