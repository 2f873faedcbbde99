"""`actor-run run BATCH.toml`: a new run of a batch file, drawn live (or one JSON event a line),
with this process as its controller (a postgresql:// ledger's run is worker.py's)."""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Event, Released
from actor_run.protocols.specs import MAX_CONCURRENCY
from actor_run.supervisors.cli import oneline
from actor_run.supervisors.cli import plan as cmd_plan
from actor_run.supervisors.cli.console import (
    LEDGER_HELP,
    Exit,
    Interrupts,
    count_arg,
    signals_restored,
    watch,
    where_state_lives,
)
from actor_run.supervisors.ledger.db import describe
from actor_run.supervisors.views.runlog import event_logger, open_run_log

RUN_EXAMPLE = """examples:
  actor-run run examples/seeds.toml --out results/
  actor-run run --gpu H100 --cloud runpod --seeds 1-8 --timeout 2h -- python train.py --seed {seed}
  actor-run run --gpu H100 --seeds 1-8 --print-batch -- python train.py --seed {seed} > train.toml
  actor-run run examples/sim.toml --ledger postgresql://team@db.example/actor_run --submit-only
"""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    run: argparse.ArgumentParser = sub.add_parser(
        "run", help="run a batch file (a new run: its id is printed first)",
        epilog=RUN_EXAMPLE + "\n" + where_state_lives(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("batch", nargs="?", help="a batch file (TOML); or none, and a command after --")
    run.add_argument("--json", action="store_true", help="one event per line (JSON), each with its run")
    run.add_argument("--concurrency", type=count_arg(1, MAX_CONCURRENCY),
                     help="jobs at once (default: the batch's policy.concurrency)")
    run.add_argument("--ledger", help=LEDGER_HELP)
    run.add_argument("--out", default="actor-run-out", help="where results go (recorded with the run)")
    run.add_argument("--state-dir", help=argparse.SUPPRESS)
    oneline.add_flags(run)
    return run


def cmd_print_batch(args: argparse.Namespace) -> int:
    """`run ... --print-batch`: the batch the flags make, as a TOML file, checked first."""
    try:
        oneline.load(args)
        raw, _ = oneline.batch_table(args)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    sys.stdout.write(oneline.toml_text(raw))
    return Exit.OK


def cmd_run(args: argparse.Namespace) -> int:
    from loguru import logger

    from actor_run.supervisors.api.runner import Runner  # the tree (trio, pykka, the clouds): only when it runs

    try:
        batch = oneline.load(args)
        if args.concurrency is not None and args.concurrency < 1:
            raise SpecError("--concurrency", f"expected int >= 1, got {args.concurrency}")
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    if not cmd_plan.confirm(args, batch):
        sys.stderr.write("actor-run: not started\n")
        return Exit.USAGE
    jobs = batch.jobs()
    concurrency = args.concurrency or batch.spec.policy.concurrency
    events: collections.deque[Event] = collections.deque()
    runner = Runner(out_dir=args.out, ledger=args.ledger, state_dir=args.state_dir, concurrency=concurrency,
                    budget_usd=batch.spec.policy.budget_usd, batch=oneline.label(args, batch),
                    config=args.config)
    interrupts = Interrupts(runner)
    unconfirmed: list[Released] = []
    log: int | None = None
    try:
        with signals_restored(), runner:  # the handlers stay ours until its machines are deleted
            for job in jobs:
                runner.check(job)  # every job checked before any starts
            run = runner.start_run()
            log = open_run_log(runner.state_dir, run)
            runner.subscribe(event_logger(runner.run_of))
            # the run's id first (on stderr with --json: stdout is one event per line, each naming it)
            print(f"run {run}: {len(jobs)} job(s), results in {runner.out_dir}\n"
                  f"controller pid {os.getpid()}; to stop it from another terminal: actor-run cancel {run}"
                  + (f" --ledger {describe(args.ledger)}" if args.ledger else ""),
                  file=sys.stderr if args.json else sys.stdout, flush=True)
            runner.subscribe(events.append)
            signal.signal(signal.SIGINT, interrupts)
            signal.signal(signal.SIGTERM, interrupts)
            keys: list[str] = []
            for j in jobs:  # 100,000 seeds take minutes to submit: a Ctrl-C meanwhile submits no more
                if interrupts.count:
                    sys.stderr.write(f"actor-run: {len(jobs) - len(keys)} job(s) not submitted (interrupted)\n")
                    break
                keys.append(runner.submit(j).key)
            ended = watch(runner, keys, events, json_mode=args.json,
                          unconfirmed=unconfirmed, budget_usd=batch.spec.policy.budget_usd)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    finally:
        if log is not None:
            logger.remove(log)
    if interrupts.count:
        return Exit.INTERRUPTED
    if unconfirmed:
        return Exit.FAILED  # a machine may still be running (and billing): not a clean success
    return Exit.OK if all(e.outcome == "succeeded" for e in ended) else Exit.FAILED
