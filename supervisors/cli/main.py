"""The `actor-run` command's parser: the commands, each registered by its module in this package
(its parser and its body: run.py, runs.py (runs, status), sweep.py, ...), what they share in
console.py. It parses, the command builds specs, calls the Runner, renders. Nothing else.

    actor-run run BATCH.toml [--json] [--concurrency N] [--ledger PATH] [--out DIR] [--detach]  (detach.py)
    actor-run run [BATCH.toml] --gpu H100 [--cloud C] [--seeds 1-8] ... [--print-batch] -- CMD  (batch_file.py)
    actor-run runs [--json] [--ledger PATH]
    actor-run status [--run ID] [--json] [--ledger PATH]
    actor-run sweep [--json] [--dry-run] [--owner ID] [--grace S] [--ledger PATH]
    actor-run cancel RUN|JOB|JOB/SEED [--run ID] [--wait S] [--ledger PATH]
    actor-run ssh JOB/SEED [--run ID] [-- CMD]
    actor-run resume [RUN] [--json] [--ledger PATH]
    actor-run cost [RUN] [--json] [--by job|cloud|gpu|account] [--ledger PATH]
    actor-run logs JOB[/SEED] [-f] [--attempt N] [--run ID] [--ledger PATH]
    actor-run report [RUN] [--out FILE.html] [--ledger PATH]
    actor-run clouds check [NAME] [--batch FILE]
    actor-run plan BATCH [--json]            (also: run BATCH --dry-run; run asks on a terminal: --yes)
    actor-run offers [--gpu G] [--cloud NAME] [--region R] [--max-price USD] [--json]
    actor-run worker --ledger postgresql://... [--concurrency N]   (worker.py: a shared ledger)
    actor-run config show [BATCH] [--json]
    actor-run completion bash|zsh
    actor-run --version; --config PATH (the user settings, supervisors/api/config.py) before or after any command
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from actor_run.protocols.failures import SpecError
from actor_run.supervisors.api.gc_tuning import tune_gc
from actor_run.supervisors.api.places import default_state_dir
from actor_run.supervisors.cli import budget as cmd_budget
from actor_run.supervisors.cli import cancel as cmd_cancel
from actor_run.supervisors.cli import clouds as cmd_clouds
from actor_run.supervisors.cli import completion as cmd_completion
from actor_run.supervisors.cli import config as cmd_config
from actor_run.supervisors.cli import cost as cmd_cost
from actor_run.supervisors.cli import dashboard as cmd_dashboard
from actor_run.supervisors.cli import logs as cmd_logs
from actor_run.supervisors.cli import offers as cmd_offers
from actor_run.supervisors.cli import plan as cmd_plan
from actor_run.supervisors.cli import report as cmd_report
from actor_run.supervisors.cli import resume as cmd_resume
from actor_run.supervisors.cli import run as cmd_run
from actor_run.supervisors.cli import runs as cmd_runs
from actor_run.supervisors.cli import ssh as cmd_ssh
from actor_run.supervisors.cli import sweep as cmd_sweep
from actor_run.supervisors.cli import worker as cmd_worker
from actor_run.supervisors.cli.console import Exit, configure_logging, interrupted, usage_error
from actor_run.supervisors.ledger import LedgerError, LedgerUnusable
from actor_run.supervisors.views.text import printable, printable_stdout

__all__ = ["Exit", "entry", "main"]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # epilogs keep their lines
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # one line, exit 2
        if message.startswith("the following arguments are required") and any(
                isinstance(a, argparse._SubParsersAction) for a in self._actions):
            sys.stderr.write(self.format_help())  # `actor-run`, `actor-run clouds`: no command named, its usage
            raise SystemExit(Exit.USAGE)
        sys.stderr.write(f"actor-run: {_did_you_mean(message)}\n")
        raise SystemExit(Exit.USAGE)


def _did_you_mean(message: str) -> str:
    """argparse's "invalid choice: 'stauts' (choose from ...)" with the nearest choice first."""
    import difflib
    import re

    m = re.match(r"(?P<head>.*)invalid choice: '(?P<got>[^']*)' \(choose from (?P<choices>.*)\)$", message)
    if m is None:
        return message
    choices = re.findall(r"'([^']*)'", m.group("choices")) or [c.strip() for c in m.group("choices").split(",")]
    close = difflib.get_close_matches(m.group("got"), choices, n=2, cutoff=0.5)
    if not close:
        return message
    return (f"{m.group('head')}invalid choice: {m.group('got')!r} (did you mean "
            f"{' or '.join(repr(c) for c in close)}?; choose from {m.group('choices')})")


class _Version(argparse._VersionAction):
    """`--version`: the installed version is read (importlib.metadata, about 50 ms) only when asked."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from actor_run.protocols.version import package_version

        self.version = f"actor-run {package_version()}"
        super().__call__(parser, namespace, values, option_string)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="actor-run", description="Run GPU jobs on rented machines, in attempts.",
                epilog="examples:\n  actor-run run examples/seeds.toml\n  actor-run <command> --help\n")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = cmd_run.add_parser(sub)
    cmd_plan.add_run_flags(run)
    cmd_worker.add_run_arguments(run)
    cmd_worker.add_worker_parser(sub)
    cmd_runs.add_parsers(sub)
    cmd_sweep.add_parser(sub)
    cmd_cancel.add_parser(sub)
    cmd_ssh.add_parser(sub)
    cmd_resume.add_parser(sub)
    cmd_cost.add_parser(sub)
    cmd_logs.add_parser(sub)
    cmd_report.add_parser(sub)
    cmd_dashboard.add_parser(sub)
    cmd_budget.add_parser(sub)
    cmd_clouds.add_parser(sub)
    cmd_offers.add_parser(sub)
    cmd_plan.add_parser(sub)
    cmd_config.add_parser(sub)
    cmd_completion.add_parser(sub)
    _config_option(p, top=True)  # last: every command registered above gets it
    return p


def _config_option(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """`--config PATH` before or after any command (supervisors/api/config.py says what it is)."""
    if "--config" not in p._option_string_actions:  # a command may define its own
        p.add_argument("--config", metavar="PATH", default=None if top else argparse.SUPPRESS,
                       help="the user settings file (default: $ACTOR_RUN_CONFIG, else ~/.config/actor-run/config.toml)")
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _config_option(child)


TAKES_COMMAND = ("run", "ssh")  # the commands that take a command after `--`
# the commands that print tables and lines: every write to stdout goes through `printable` (a job's
# detail, a host's name, a progress key cannot reach the terminal as an escape sequence)
TABLES = ("cancel", "clouds", "config", "cost", "offers", "plan", "runs", "status", "sweep")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    whole = list(argv)  # what a detached run's controller is started with (detach.py)
    tail = None
    if "--" in argv:  # what follows `--` is a command for the machine, never our options
        cut = argv.index("--")
        argv, tail = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    args.tail = tail
    args.argv = whole
    if tail is not None and args.command not in TAKES_COMMAND:
        return usage_error(f"{args.command}: takes no command after --")
    configure_logging()
    if getattr(args, "state_dir", None) is None:
        args.state_dir = str(default_state_dir())
    try:
        shared = cmd_worker.shared(args)  # a postgresql:// ledger (and a bad --ledger said here, in one line)
        if shared and args.command not in ("worker", "run"):  # reachable? (those two ask once their input is checked)
            cmd_worker.wait_for_ledger(args)
    except SpecError as exc:
        return usage_error(str(exc))
    except LedgerError as exc:
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.FAILED
    if shared and getattr(args, "detach", False) and args.command == "run":
        return usage_error("--detach: a shared (postgresql://) ledger's run needs no controller of its own: "
                           "queue it with --submit-only and let `actor-run worker` run it")
    run = (cmd_run.cmd_print_batch if getattr(args, "print_batch", False)
           else cmd_plan.cmd_plan if getattr(args, "dry_run", False)
           else cmd_worker.cmd_run_shared if shared else cmd_run.cmd_run)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": run, "runs": cmd_runs.cmd_runs,
        "status": cmd_worker.cmd_follow if getattr(args, "follow", False) else cmd_runs.cmd_status,
        "sweep": cmd_sweep.cmd_sweep, "resume": cmd_resume.cmd_resume, "worker": cmd_worker.cmd_worker,
        "cost": cmd_cost.cmd_cost, "logs": cmd_logs.cmd_logs, "report": cmd_report.cmd_report,
        "dashboard": cmd_dashboard.cmd_dashboard, "budget": cmd_budget.cmd_budget,
        "clouds": cmd_clouds.cmd_clouds, "offers": cmd_offers.cmd_offers, "plan": cmd_plan.cmd_plan,
        "cancel": cmd_cancel.cmd_cancel, "ssh": cmd_ssh.cmd_ssh,
        "config": cmd_config.cmd_config, "completion": lambda a: cmd_completion.cmd_completion(a, parser),
    }
    try:
        with printable_stdout(args.command in TABLES and not getattr(args, "follow", False)):
            return commands[args.command](args)
    except SpecError as exc:  # bad input found after parsing (a batch, the user config): one line
        sys.stderr.write(f"actor-run: {exc}\n")
        return Exit.USAGE
    except LedgerError as exc:  # a ledger that is no ledger is bad input (2); one that fails or is away is not (1)
        sys.stderr.write(f"actor-run: {printable(str(exc))}\n")
        return Exit.USAGE if isinstance(exc, LedgerUnusable) else Exit.FAILED


def entry() -> None:
    """The `actor-run` console script: this process is ours, so the collector is set for batches
    of thousands of attempts (gc_tuning.py) before the command runs. A reader that stops reading
    (`actor-run runs | head -1`) ends it quietly, as Unix tools end: exit 141 (128 + SIGPIPE), no
    traceback (a run's `with Runner` still deletes its machines on the way out). A Ctrl-C that no
    command handles itself (a prompt, `logs -f`, `status --follow`, a cloud's answer awaited, the
    imports before a run opens its Runner, which deletes what it made on the way out) is one line
    and exit 130. The collector is not run first: at this point only imports have run and they
    leave no garbage (gc_tuning.py)."""
    tune_gc(collect=False)
    try:
        code = main()
        sys.stdout.flush()  # inside the try: what is still buffered may meet the closed pipe
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's own flush at exit finds somewhere to write
        code = 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        code = interrupted()
    except BaseExceptionGroup as group:  # a Ctrl-C inside a trio nursery (`offers`, `plan` asking the clouds)
        if group.split(KeyboardInterrupt)[1] is not None:
            raise  # something else went wrong too: not for this line to hide
        code = interrupted()
    sys.exit(code)
