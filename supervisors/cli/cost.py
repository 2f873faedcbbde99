"""`actor-run cost [RUN] [--json] [--by job|cloud|gpu|account|budget|run|user]`: what the machines cost, read from
the ledger.

    actor-run cost                          # the latest run, one row per job
    actor-run cost 3f2a9c1d --by account    # that run (`actor-run runs` lists them), split by account
    actor-run cost --all --json --by gpu    # every run: one JSON object per group, then the total

A run is one `actor-run run` (or one resumed part of it: a resume keeps the run). Each attempt
that reserved money has a row in the ledger's `reservations` (job.py writes it before
the lease, and replaces the reservation by the charge when the machine is gone; a sweep or a
resume charges those of a controller that died). A group's figures: dollars spent and
machine-hours, what was reserved for them (and what is still held by attempts not ended), and the
part of the spend that went on attempts that did not succeed (retries and failures). A machine
whose deletion was never confirmed is billed up to its deadline and shown as "at least": the
provider may bill more, until someone deletes it (`actor-run sweep`).

Cache volumes (a candidate's `cache`) are billed apart, whatever run made them: each row says its
size, how long it has existed (to its deletion by `actor-run sweep --caches`, or to now) and what
that cost at the cloud's storage price. Their sum is not in the total: it is not any run's.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from actor_run.protocols.failures import SpecError
from actor_run.protocols.messages import Machine
from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, open_reader, usage_error
from actor_run.supervisors.ledger import UNCOUNTED, CacheRow, MachineRow

GROUPS = ("job", "cloud", "gpu", "account", "budget", "run", "user")


class CostRow(msgspec.Struct, frozen=True, kw_only=True):
    """One group's money (or the total, `group` "total")."""

    group: str
    run: str = ""  # with --all, the run the group is of (jobs of the same name in two runs are two groups)
    attempts: int = 0
    machine_hours: float = 0.0
    spent_usd: float = 0.0  # what ended attempts cost (an "at least" figure when at_least)
    reserved_usd: float = 0.0  # what was set aside for them before their leases
    held_usd: float = 0.0  # reservations of attempts not ended yet (nothing spent counted for them)
    failed_usd: float = 0.0  # spent on attempts that did not succeed: the cost of retries and failures
    failed_attempts: int = 0
    at_least: bool = False  # an unconfirmed deletion is in it: the provider may bill more


class StorageRow(msgspec.Struct, frozen=True, kw_only=True, tag="storage"):
    """One cache volume's storage so far (`--json`: a line with `"type": "storage"`)."""

    cache: str
    cloud: str
    region: str
    volume: str
    size_gb: int
    hours: float
    usd: float
    deleted: bool


def storage_rows(caches: Iterable[CacheRow], now: float | None = None) -> list[StorageRow]:
    at = time.time() if now is None else now
    return [StorageRow(cache=c.name, cloud=c.cloud, region=c.region, volume=c.volume_id, size_gb=c.size_gb,
                       hours=round(max(0.0, (c.deleted if c.deleted is not None else at) - c.created) / 3600, 6),
                       usd=round(c.usd(at), 6), deleted=c.deleted is not None)
            for c in caches if c.volume_id]


def render_storage(rows: list[StorageRow]) -> str:
    lines = ["cache storage (not in the total: kept across runs until `actor-run sweep --caches`):"]
    for r in rows:
        state = "deleted" if r.deleted else "kept"
        lines.append(f"  {r.cache} on {r.cloud} {r.region} ({r.volume}): {r.size_gb} GB for {r.hours:.3f} h, "
                     f"{_money(r.usd)} ({state})")
    return "\n".join(lines)


class AtLeast(msgspec.Struct, frozen=True, kw_only=True):
    """A machine whose deletion was never confirmed, billed up to its deadline."""

    machine: str
    cloud: str
    job: str
    attempt: int
    usd: float
    deadline: float


def add_parser(sub: Any) -> None:
    """Register `cost` on the CLI's subparsers."""
    p = sub.add_parser(
        "cost", help="what the machines cost: per job, cloud, GPU or account",
        description="Dollars and machine-hours from the ledger, reserved vs spent, and what retries and failures "
                    "cost.",
        epilog="example:\n  actor-run cost\n  actor-run cost 3f2a9c1d --by account\n  actor-run cost --all --json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", help="a run id (see `actor-run runs`); default: the latest run")
    p.add_argument("--all", action="store_true", help="every run in the ledger")
    p.add_argument("--json", action="store_true", help="one JSON object per group, then the total")
    p.add_argument("--by", default="job", help="job | cloud | gpu | account | budget (the team budget) | run | "
                   "user (the host whose controller spent it) (default: job)")
    p.add_argument("--ledger", help=LEDGER_HELP)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)


def _group_of(r: dict[str, Any], by: str) -> str:
    match by:
        case "job":
            return str(r["job"])
        case "cloud":
            return str(r["cloud"] or "")
        case "gpu":
            return str(r["gpu"] or "-")
        case "budget":
            return str(r.get("budget") or "-")
        case "run":
            return str(r["run"])
        case "user":
            return str(r.get("user") or "-")
        case _:
            return f"{r['cloud']}/{r['account'] or 'main'}"


def at_least_rows(machines: Iterable[MachineRow], run: str | None) -> list[AtLeast]:
    """Machines still alive in the ledger whose deletion failed: billed to their deadline."""
    out = []
    for m in machines:
        if m.state != "alive" or m.phase != "delete_failed" or (run is not None and m.run != run) or not m.machine:
            continue
        made = msgspec.json.decode(m.machine, type=Machine)
        usd = max(0.0, made.deadline - made.created_at) * made.hourly_usd / 3600.0
        out.append(AtLeast(machine=m.name, cloud=m.cloud, job=f"{m.job}/seed-{m.seed}", attempt=m.attempt,
                           usd=usd, deadline=made.deadline))
    return out


def cost_rows(reservations: list[dict[str, Any]], machines: list[MachineRow], *, run: str | None = None,
              by: str = "job") -> tuple[list[CostRow], CostRow, list[AtLeast]]:
    """The groups (sorted), the total, and the "at least" machines."""
    if by not in GROUPS:
        raise SpecError("--by", f"expected one of {', '.join(GROUPS)}, got {by!r}")
    rows = [r for r in reservations if run is None or r["run"] == run]
    unconfirmed = {(m.job, m.attempt) for m in at_least_rows(machines, run)}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["run"] if run is None else "", _group_of(r, by))
        g = groups.setdefault(key, {"attempts": 0, "seconds": 0.0, "spent": 0.0, "reserved": 0.0, "held": 0.0,
                                    "failed": 0.0, "failed_attempts": 0, "at_least": False})
        walk = r.get("failure") in UNCOUNTED  # a place without stock: reserved for, but no attempt used
        g["attempts"] += 0 if walk else 1
        g["reserved"] += r["usd"] or 0.0
        if r["state"] != "released":
            g["held"] += r["usd"] or 0.0
            continue
        charged = r["charged"] or 0.0
        g["spent"] += charged
        g["seconds"] += r["seconds"] or 0.0
        if r["outcome"] != "succeeded":
            g["failed"] += charged
            g["failed_attempts"] += 0 if walk else 1
        if r["at_least"] or (r["job"], r["attempt"]) in unconfirmed:
            g["at_least"] = True
    out = [CostRow(group=k, run=in_run, attempts=g["attempts"], machine_hours=round(g["seconds"] / 3600, 6),
                   spent_usd=round(g["spent"], 6), reserved_usd=round(g["reserved"], 6), held_usd=round(g["held"], 6),
                   failed_usd=round(g["failed"], 6), failed_attempts=g["failed_attempts"], at_least=g["at_least"])
           for (in_run, k), g in sorted(groups.items())]
    total = CostRow(
        group="total", attempts=sum(c.attempts for c in out),
        machine_hours=round(sum(c.machine_hours for c in out), 6), spent_usd=round(sum(c.spent_usd for c in out), 6),
        reserved_usd=round(sum(c.reserved_usd for c in out), 6), held_usd=round(sum(c.held_usd for c in out), 6),
        failed_usd=round(sum(c.failed_usd for c in out), 6), failed_attempts=sum(c.failed_attempts for c in out),
        at_least=any(c.at_least for c in out))
    return out, total, at_least_rows(machines, run)


def _money(usd: float, at_least: bool = False) -> str:
    """Sub-dollar amounts to 4 places ($0.0068: a cheap run is not $0.00), the rest to cents."""
    amount = f"${usd:.4f}" if abs(usd) < 1 else f"${usd:,.2f}"
    return f"{'>=' if at_least else ''}{amount}"


def render(groups: list[CostRow], total: CostRow, at_least: list[AtLeast], by: str) -> str:
    """The table; the reservation columns only while money is held (an attempt not ended): on a
    finished run what was reserved has all been replaced by charges, and read as money still held."""
    live = total.held_usd > 0
    head = f"{by:<34} {'attempts':>8} {'machine-h':>10} {'spent':>11}"
    head += f" {'reserved':>11} {'held now':>9}" if live else ""
    lines = [head + f" {'failures':>16}"]
    runs = sorted({c.run for c in groups if c.run})
    sections = [(r, [c for c in groups if c.run == r]) for r in runs] if runs else [("", groups)]
    for run, rows in sections:
        if run:
            lines.append(f"run {run}")
        for c in rows:
            lines.append(_line(c, live, indent=bool(run)))
    lines.append(_line(total, live, indent=False))
    for a in at_least:
        lines.append(f"at least {_money(a.usd)}: {a.machine} on {a.cloud} ({a.job}, attempt {a.attempt}) was never "
                     "confirmed deleted; run `actor-run sweep`, or delete it in the provider's console")
    return "\n".join(lines)


def _line(c: CostRow, live: bool, *, indent: bool) -> str:
    fails = f"{_money(c.failed_usd)} ({c.failed_attempts})"
    name = ("  " + c.group)[:34] if indent else c.group[:34]
    line = f"{name:<34} {c.attempts:>8} {c.machine_hours:>10.3f} {_money(c.spent_usd, c.at_least):>11}"
    if live:
        line += f" {_money(c.reserved_usd):>11} {_money(c.held_usd):>9}"
    return line + f" {fails:>16}"


def cmd_cost(args: argparse.Namespace) -> int:
    """The command: 0, or 2 for bad input (one line naming the field)."""
    reader = open_reader(args)
    try:
        runs = reader.runs()
        if args.all:
            run = None
        elif args.run is not None:
            if not any(r.id == args.run for r in runs):
                return usage_error(f"RUN: no run {args.run!r} in this ledger (see `actor-run runs`)")
            run = args.run
        elif runs:
            run = max(runs, key=lambda r: (r.started or 0.0)).id
        else:
            return usage_error("RUN: no run in this ledger yet")
        hosts = {o.id: o.host for o in reader.owners()}
        reservations = [{**r, "user": hosts.get(r["owner"] or "", "")} for r in reader.reservations()]
        groups, total, at_least = cost_rows(reservations, reader.machines(), run=run, by=args.by)
        storage = storage_rows(reader.caches())
    except SpecError as exc:
        return usage_error(str(exc))
    finally:
        reader.close()
    if args.json:
        for row in [*groups, total, *at_least, *storage]:
            sys.stdout.write(msgspec.json.encode(row).decode() + "\n")
    else:
        if run is not None:
            print(f"run {run}")
        print(render(groups, total, at_least, args.by))
        if storage:
            print(render_storage(storage))
    return Exit.OK
