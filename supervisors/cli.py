"""The `actor-run` command: parses, builds specs, calls the Runner, renders. Nothing else: each
command other than `run` lives in a `cmd_*` module (its parser and its body), what they share in
console.py.

    actor-run run BATCH.toml [--json] [--concurrency N] [--ledger PATH] [--out DIR]
    actor-run runs [--json] [--ledger PATH]
    actor-run status [--run ID] [--json] [--ledger PATH]
    actor-run sweep [--json] [--dry-run] [--owner ID] [--grace S] [--ledger PATH]
    actor-run resume [RUN] [--json] [--ledger PATH]
    actor-run cost [RUN] [--json] [--by job|cloud|gpu|account] [--ledger PATH]
    actor-run logs JOB[/SEED] [-f] [--attempt N] [--run ID] [--ledger PATH]
    actor-run report [RUN] [--out FILE.html] [--ledger PATH]
    actor-run clouds check [NAME] [--batch FILE]
    actor-run worker --ledger postgresql://... [--concurrency N]   (cmd_worker.py: a shared ledger)
    actor-run config show [BATCH] [--json]
    actor-run completion bash|zsh
    actor-run --version; --config PATH (the user settings, supervisors/config.py) before or after any command
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from actor_run import __version__
from actor_run.protocols.clouds import known_clouds
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Event, Released
from actor_run.protocols.specs import load_batch
from actor_run.supervisors import (
    cmd_clouds,
    cmd_completion,
    cmd_config,
    cmd_cost,
    cmd_logs,
    cmd_report,
    cmd_resume,
    cmd_runs,
    cmd_sweep,
    cmd_worker,
)
from actor_run.supervisors.console import Exit, Interrupts, configure_logging, usage_error, watch
from actor_run.supervisors.gc_tuning import tune_gc
from actor_run.supervisors.runlog import event_logger, open_run_log
from actor_run.supervisors.runner import Runner, default_state_dir

__all__ = ["Exit", "entry", "main"]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # epilogs keep their lines
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # one line, exit 2
        sys.stderr.write(f"actor-run: {message}\n")
        raise SystemExit(Exit.USAGE)


RUN_EXAMPLE = """example:
  actor-run run examples/seeds.toml --out results/
  actor-run run examples/sim.toml --ledger postgresql://team@db.example/actor_run --submit-only
"""


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="actor-run", description="Run GPU jobs on rented machines, in attempts.",
                epilog="examples:\n  actor-run run examples/seeds.toml\n  actor-run <command> --help\n")
    p.add_argument("--version", action="version", version=f"actor-run {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a batch file (a new run: its id is printed first)", epilog=RUN_EXAMPLE,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("batch")
    run.add_argument("--json", action="store_true", help="one event per line (JSON), each with its run")
    run.add_argument("--concurrency", type=int)
    run.add_argument("--ledger")
    run.add_argument("--out", default="actor-run-out", help="where results go (recorded with the run)")
    run.add_argument("--state-dir", help=argparse.SUPPRESS)
    cmd_worker.add_run_arguments(run)
    cmd_worker.add_worker_parser(sub)
    cmd_runs.add_parsers(sub)
    cmd_sweep.add_parser(sub)
    cmd_resume.add_parser(sub)
    cmd_cost.add_parser(sub)
    cmd_logs.add_parser(sub)
    cmd_report.add_parser(sub)
    cmd_clouds.add_parser(sub)
    cmd_config.add_parser(sub)
    cmd_completion.add_parser(sub)
    _config_option(p, top=True)  # last: every command registered above gets it
    return p


def _config_option(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """`--config PATH` before or after any command (supervisors/config.py says what it is)."""
    if "--config" not in p._option_string_actions:  # a command may define its own
        p.add_argument("--config", metavar="PATH", default=None if top else argparse.SUPPRESS,
                       help="the user settings file (default: $ACTOR_RUN_CONFIG, else ~/.config/actor-run/config.toml)")
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _config_option(child)


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
                    budget_usd=batch.spec.policy.budget_usd, batch=str(Path(args.batch).resolve()),
                    config=args.config)
    interrupts = Interrupts(runner)
    unconfirmed: list[Released] = []
    try:
        with runner:
            for job in jobs:
                runner.check(job)  # every job checked before any starts
            run = runner.start_run()
            log = open_run_log(runner.state_dir, run)
            runner.subscribe(event_logger(runner.run_of))
            # the run's id first (on stderr with --json: stdout is one event per line, each naming it)
            print(f"run {run}: {len(jobs)} job(s), results in {runner.out_dir}",
                  file=sys.stderr if args.json else sys.stdout, flush=True)
            runner.subscribe(events.append)
            previous = signal.signal(signal.SIGINT, interrupts)
            signal.signal(signal.SIGTERM, interrupts)
            ended = watch(runner, [runner.submit(j).key for j in jobs], events, json_mode=args.json,
                          unconfirmed=unconfirmed, budget_usd=batch.spec.policy.budget_usd)
        signal.signal(signal.SIGINT, previous)
        logger.remove(log)
    except SpecError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    if interrupts.count:
        return Exit.INTERRUPTED
    if unconfirmed:
        return Exit.FAILED  # a machine may still be running (and billing): not a clean success
    return Exit.OK if all(e.outcome == "succeeded" for e in ended) else Exit.FAILED


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging()
    if getattr(args, "state_dir", None) is None:
        args.state_dir = str(default_state_dir())
    try:
        shared = cmd_worker.shared(args)  # a postgresql:// ledger (and a bad --ledger said here, in one line)
    except SpecError as exc:
        return usage_error(str(exc))
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": cmd_worker.cmd_run_shared if shared else cmd_run, "runs": cmd_runs.cmd_runs,
        "status": cmd_worker.cmd_follow if getattr(args, "follow", False) else cmd_runs.cmd_status,
        "sweep": cmd_sweep.cmd_sweep, "resume": cmd_resume.cmd_resume, "worker": cmd_worker.cmd_worker,
        "cost": cmd_cost.cmd_cost, "logs": cmd_logs.cmd_logs, "report": cmd_report.cmd_report,
        "clouds": cmd_clouds.cmd_clouds,
        "config": cmd_config.cmd_config, "completion": lambda a: cmd_completion.cmd_completion(a, parser),
    }
    try:
        return commands[args.command](args)
    except SpecError as exc:  # bad input found after parsing (a batch, the user config): one line
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE


def entry() -> None:
    """The `actor-run` console script: this process is ours, so the collector is set for batches
    of thousands of attempts (gc_tuning.py) before the command runs."""
    tune_gc()
    sys.exit(main())

