"""`actor-run resume [RUN]`: take over the unfinished jobs of controllers that died, of one run or
of every run, each written to the folder its run recorded (resume.py decides what to take)."""

from __future__ import annotations

import argparse
import collections
import sys

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Event, JobEnded
from actor_run.supervisors.cli.console import (
    LEDGER_HELP,
    Exit,
    Interrupts,
    exit_of,
    on_stop,
    open_reader,
    signals_restored,
    usage_error,
    watch,
)
from actor_run.supervisors.views.runlog import event_logger, open_run_log

HELP = "pick up the unfinished jobs of controllers that died"
EXAMPLE = """example:
  actor-run resume              # every unfinished run whose controller is gone
  actor-run resume 3f2a9c1d     # only that run (see `actor-run runs`)
"""


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("resume", help=HELP, description=HELP, epilog=EXAMPLE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", help="the run to take over (default: every unfinished run of a dead owner)")
    p.add_argument("--json", action="store_true", help="one event per line (JSON)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--out", default="actor-run-out",
                   help="only for jobs whose run recorded no output folder (a ledger from before runs)")
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def cmd_resume(args: argparse.Namespace) -> int:
    from loguru import logger

    from actor_run.supervisors.api.runner import Runner  # the tree (trio, pykka, the clouds): only when it runs

    if args.run is not None:
        reader = open_reader(args)
        try:
            known = reader.run(args.run)
        finally:
            reader.close()
        if known is None:
            return usage_error(f"run: no run {args.run!r} in this ledger (see `actor-run runs`)")
    events: collections.deque[Event] = collections.deque()
    runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir, sweep_on_start=False,
                    config=args.config)
    interrupts = Interrupts(runner)
    ended: list[JobEnded] = []
    logs: dict[str, int] = {}
    try:
        with signals_restored(), runner:  # the handlers stay ours until its machines are deleted
            runner.subscribe(events.append)
            runner.subscribe(event_logger(runner.run_of))
            on_stop(interrupts)  # Ctrl-C, SIGTERM, SIGHUP (its terminal closed): cancel and delete
            first = True
            while not interrupts.count:
                # one job of a name and seed at a time: two unfinished runs of one batch go one after the other
                handles = runner.resume(args.run)
                if not args.json:
                    if first:
                        for a in runner.swept:
                            if a.action in ("deleted", "failed", "closed"):
                                print(f"swept {a.machine}: {a.action} ({a.reason})")
                    if not handles and first and args.run is not None:
                        print(f"run {args.run} has no unfinished job of a controller that died")
                    elif handles or first:
                        runs = sorted({h.run for h in handles})
                        print(f"resuming {len(handles)} job(s)" + (f" of run {', '.join(runs)}" if runs else "")
                              + (": " if handles else "") + ", ".join(
                                  f"{h.key}{' (reattached)' if h.reattached else ''}" for h in handles))
                first = False
                if not handles:
                    break
                for run in sorted({h.run for h in handles} - set(logs)):  # each run's lines to its own log
                    logs[run] = open_run_log(runner.state_dir, run)
                ended += watch(runner, [h.key for h in handles], events, json_mode=args.json)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    finally:
        for handler in logs.values():
            logger.remove(handler)
    if interrupts.count:
        return Exit.INTERRUPTED
    return exit_of(ended)
