"""`actor-run ssh JOB/SEED [-- CMD]`: a shell (or CMD) on the machine of the job's running attempt,
in its job folder, for debugging a stuck job in place.

Over SSH (the ssh cloud, rented clouds) it runs the OpenSSH client held to the host key the
controller pinned (our own known-hosts file, StrictHostKeyChecking=yes, no agent or forwarding);
a terminal gets a login shell (`-t`), CMD runs without one. On `local` and `sim` the machine is a
sandbox folder on this computer: the shell opens there. A serverless job has no machine of ours to
open a shell on, and a SkyPilot cluster's login is SkyPilot's: the command says so in one line
(exit 2). The exit code is the shell's or CMD's.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.clouds import SSHLogin, make_cloud, split_key
from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Machine
from actor_run.protocols.specs import job_key
from actor_run.supervisors.api.config import load_config
from actor_run.supervisors.cli.console import LEDGER_HELP, open_reader, usage_error

LOCAL = ("local", "sim")  # machines that are sandbox folders on this computer
NO_SHELL = {
    "runpod-serverless": "a serverless job runs as a queued request in a RunPod worker, not on a machine of ours:"
                         " there is no shell to open (its log: actor-run logs {job})",
    "skypilot": "actor-run opens no shell on a SkyPilot cluster (SkyPilot holds its login: its key and host entry);"
                " use SkyPilot's: ssh {name}{cd}",
}
EXAMPLE = """examples:
  actor-run ssh train/3                  # a shell in the job folder of seed 3's running attempt
  actor-run ssh train/3 -- tail -n 20 log.txt
"""


def add_parser(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("ssh", help="a shell (or -- CMD) on a running job's machine, in its job folder",
                       epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("job", metavar="JOB/SEED", help="the job and seed (train/3 or train/seed-3)")
    p.add_argument("--run", help="the job of this run (default: the one running it now)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def _running(args: argparse.Namespace, name: str, seed: int) -> tuple[Any, dict[str, Any]] | None:
    """The alive machine of the job's newest attempt (its ledger row), and the settings of its cloud
    that job was run with (its own run's `[clouds.<name>]`, as its spec recorded it; not the newest
    table of any run: another run's ssh hosts may name other machines)."""
    reader = open_reader(args)
    try:
        rows = [m for m in reader.machines(alive_only=True) if m.job == name and m.seed == seed
                and (args.run is None or m.run == args.run)]
        rows.sort(key=lambda m: (m.created or 0.0, m.attempt or 0))
        if not rows:
            return None
        row = rows[-1]
        cloud_name, _ = split_key(row.cloud)
        own = reader.job_clouds(row.run, job_key(name, seed))
        if own is not None:
            return row, own.get(cloud_name, {})
        recorded = dict(reader.clouds())  # a job row without its spec: the table recorded for that cloud
        return row, recorded.get(row.cloud, recorded.get(cloud_name, {}))
    finally:
        reader.close()


def cmd_ssh(args: argparse.Namespace) -> int:
    m = re.fullmatch(r"([a-z0-9-]{1,40})/(?:seed-)?(-?\d+)", args.job)
    if not m:
        return usage_error(f"ssh: expected JOB/SEED (train/3), got {args.job!r}")
    name, seed = m.group(1), int(m.group(2))
    found = _running(args, name, seed)
    if found is None:
        return usage_error(f"ssh: {name}/seed-{seed} has no machine alive now (`actor-run status` shows what runs)")
    row, settings = found
    cloud_name, _ = split_key(row.cloud)
    if cloud_name in NO_SHELL:
        cd = f", then cd {shlex.quote(row.work)}" if row.work else ""
        return usage_error(f"ssh: {row.cloud}: " + NO_SHELL[cloud_name].format(job=args.job, name=row.name, cd=cd))
    if not row.machine or not row.work:
        return usage_error(f"ssh: {name}/seed-{seed}'s machine {row.name} has not started its job yet; try again")
    machine = msgspec.json.decode(row.machine, type=Machine)
    command = args.tail
    if command is not None and not command:
        return usage_error("ssh: expected a command after --")
    if cloud_name in LOCAL:
        return _local(row.work, command)
    try:
        config = load_config(args.config)
        cloud = make_cloud(row.cloud, config.cloud_settings(cloud_name, settings), Path(args.state_dir))
    except SpecError as exc:
        return usage_error(str(exc))
    if not isinstance(cloud, SSHLogin):
        return usage_error(f"ssh: {row.cloud} machines take no shell from actor-run")
    ssh = cloud.login(machine)
    remote = f"cd {shlex.quote(row.work)} && " + (
        (command[0] if len(command) == 1 else shlex.join(command)) if command else 'exec "${SHELL:-sh}" -l')
    interactive = command is None and sys.stdin.isatty()
    if interactive:
        ssh = ["-t" if a == "-T" else a for a in ssh]
    return subprocess.run([*ssh, remote], check=False).returncode


def _local(work: str, command: list[str] | None) -> int:
    if not Path(work).is_dir():
        return usage_error(f"ssh: the job folder {work} is gone (the attempt ended)")
    if command is None:
        shell = os.environ.get("SHELL") or "sh"
        return subprocess.run([shell], cwd=work, check=False).returncode
    line = command[0] if len(command) == 1 else shlex.join(command)
    return subprocess.run(["sh", "-c", line], cwd=work, check=False).returncode


__all__ = ["add_parser", "cmd_ssh"]
