"""`actor-run runs` (every run in the ledger, one line each) and `actor-run status` (the jobs of
one run, and every machine still alive)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import msgspec

from actor_run.protocols.failures import Code
from actor_run.protocols.messages import is_waiting
from actor_run.protocols.specs import Job, PolicySpec
from actor_run.supervisors.cli.console import LEDGER_HELP, Exit, number_arg, open_reader, usage_error
from actor_run.supervisors.ledger import JobMoney, LedgerReader, RunRow, money_by_job
from actor_run.supervisors.tree import counts
from actor_run.supervisors.views.runlog import run_log_path

RUNS_HELP = "list the runs in the ledger: id, batch, started, state, jobs, cost; where their controller logs are"
RUNS_EXAMPLE = """example:
  actor-run runs
  actor-run runs --json | jq -r 'select(.state == "abandoned") | .id'
"""
STATUS_HELP = ("show the jobs of every run still running (whoever started it) and of the latest ended one (or of "
               "--run ID), and every machine still alive")
STATUS_EXAMPLE = """example:
  actor-run status
  actor-run status --run 3f2a9c1d --json
"""


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    runs = sub.add_parser("runs", help=RUNS_HELP, description=RUNS_HELP, epilog=RUNS_EXAMPLE,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    status = sub.add_parser("status", help=STATUS_HELP, description=STATUS_HELP, epilog=STATUS_EXAMPLE,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    status.add_argument("--run", help="the run to show (default: the latest)")
    status.add_argument("--follow", action="store_true",
                        help="print job state changes (every controller's) until none is queued or running")
    status.add_argument("--poll", type=number_arg(0, 3600, strict=True), default=1.0, help=argparse.SUPPRESS)
    for p in (runs, status):
        p.add_argument("--json", action="store_true", help="one JSON object per line")
        p.add_argument("--ledger", help=LEDGER_HELP)
        p.add_argument("--state-dir", help=argparse.SUPPRESS)


def run_state(run: RunRow, live: set[str]) -> str:
    """running (its controller is alive, or on a shared ledger a live worker holds a job of it),
    queued (on a shared ledger: jobs wait for a worker), abandoned (unfinished, its controller
    gone: `actor-run resume` takes it), succeeded, failed (some job failed), canceled (none failed,
    some canceled), or empty (no job)."""
    if run.unfinished:
        if (run.owner in live and run.state == "running") or run.held:
            return "running"
        return "queued" if run.queued else "abandoned"
    if run.jobs == 0:
        return "running" if run.owner in live and run.state == "running" else "empty"
    return "failed" if run.failed else "canceled" if run.canceled else "succeeded"


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """A job as `status` shows it: `state` is queued (no attempt yet: waiting for a slot or a
    worker), waiting (between attempts), starting (its machine is being leased or set up),
    running, or how it ended; where it runs, its job's last stage, what it cost so far."""

    key: str
    state: str
    place: str = ""
    stage: str = ""
    usd: float = 0.0
    attempts: int = 0
    failure: str = ""
    detail: str = ""
    # each retry budget's count against its limit (`{"preemptions": {"used": 3, "limit": 5}}`), and
    # the job's own words on its last failed attempt (a retriable verdict's reason, an out-of-memory line)
    counts: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    reason: str = ""


def _counts(spec: Any, failures: list[str | None]) -> dict[str, dict[str, int]]:
    """Each budget's count after attempts that ended with `failures`, against the job's policy
    (from its spec in the ledger; the defaults' when it cannot be read)."""
    try:
        policy = msgspec.json.decode(spec, type=Job).policy if spec else PolicySpec()
    except (msgspec.DecodeError, TypeError):
        policy = PolicySpec()
    known = {str(c) for c in Code}
    codes = [Code(f) if f is not None and f in known else None for f in failures]
    return {k: msgspec.structs.asdict(v) for k, v in counts(codes, policy).items()}


def _reason(detail: str) -> str:
    """The job's own words in an attempt's detail: what follows the verdict's "...: " (verdict.py)."""
    return detail.split("): ", 1)[1] if "): " in detail else ""


def job_views(reader: LedgerReader, run: str, jobs: list[dict[str, Any]], now: float) -> list[JobView]:
    machines = [m for m in reader.machines(alive_only=True) if m.run == run]
    attempts = reader.attempts(run)
    money = money_by_job(reader.reservations(run), attempts)  # the figures `actor-run cost` adds up
    stages: dict[str, str] = {}
    for e in reader.events(run=run):
        if e["type"] == "Progress":
            stages[e["job"]] = str(msgspec.json.decode(e["body"]).get("stage") or "")
    waits = reader.stages(run)  # booting, waiting for ssh, waiting for capacity or a team budget
    out = []
    for j in jobs:
        ended = [a for a in attempts if a["job"] == j["key"]]
        paid = money.get(j["key"])
        spent = paid.charged_usd if paid is not None else j["usd"] or 0.0
        paid = paid or JobMoney()
        mine = [m for m in machines if m.job == j["name"] and m.seed == j["seed"]]
        state, place, usd = j["state"], "", spent
        if state == "failed" and j["failure"] == "canceled":
            state = "canceled"
        if state == "running":
            if mine:
                m = max(mine, key=lambda m: m.attempt)
                place = " ".join(x for x in (m.cloud, m.region or "") if x)
                state = "running" if m.phase == "running" else "starting"
                usd = spent + (m.hourly_usd or 0.0) * max(0.0, now - (m.launched_at or m.created)) / 3600
            else:
                state = "waiting" if ended or is_waiting(waits.get(j["key"], "")) else "queued"
        stage = stages.get(j["key"], "") if state in ("running", "starting") else ""
        if j["state"] == "running" and j["key"] in waits:
            stage = waits[j["key"]]
        out.append(JobView(key=j["key"], state=state, place=place, stage=stage, usd=usd,
                           attempts=len(paid.attempts | {m.attempt for m in mine}),
                           failure=j["failure"] or "", detail=j["detail"] or "",
                           counts=_counts(j.get("spec"), [a["failure"] for a in ended]),
                           reason=next((_reason(a["detail"] or "") for a in reversed(ended)
                                        if a["failure"] in (Code.RETRIABLE, Code.OOM)), "")))
    return out


def view_line(v: JobView) -> str:
    where = f" on {v.place}" if v.place else ""
    stage = f", stage {v.stage}" if v.stage else ""
    tail = f"  {v.failure}: {v.detail}" if v.failure else ""
    reason = f"  (last retried for: {v.reason})" if v.reason and not v.failure else ""
    budgets = "  [" + ", ".join(f"{k} {c['used']}/{c['limit']}" for k, c in v.counts.items()) + "]" if v.counts else ""
    return f"{v.key:<32} {v.state:<10} {v.attempts:>2} attempt(s) ${v.usd:.4f}{where}{stage}{tail}{reason}{budgets}"


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _run_dict(run: RunRow, live: set[str]) -> dict[str, Any]:
    d = msgspec.structs.asdict(run)
    d["state"] = run_state(run, live)
    d["owner_alive"] = run.owner in live
    return d


def cmd_runs(args: argparse.Namespace) -> int:
    reader = open_reader(args)
    try:
        runs, live = reader.runs(), reader.live_owners()
    finally:
        reader.close()
    if args.json:
        for r in runs:
            log = run_log_path(args.state_dir, r.id)
            d = {**_run_dict(r, live), "log": str(log) if log.exists() else None}
            sys.stdout.write(msgspec.json.encode(d).decode() + "\n")
        return Exit.OK
    if not runs:
        print("no run in the ledger")
        return Exit.OK
    print(f"{'run':<9} {'started':<19} {'state':<10} {'ok':>4} {'fail':>4} {'canc':>4} {'left':>4} {'cost':>10}  batch")
    for r in runs:
        print(f"{r.id:<9} {_when(r.started):<19} {run_state(r, live):<10} {r.succeeded:>4} {r.failed:>4} "
              f"{r.canceled:>4} {r.unfinished:>4} {'$' + format(r.usd, '.4f'):>10}  {r.batch or '-'}")
    print(f"each run's controller log: {run_log_path(args.state_dir, '<run>')}")
    return Exit.OK


def cmd_status(args: argparse.Namespace) -> int:
    reader = open_reader(args)
    try:
        return _status(args, reader)
    finally:
        reader.close()


UNFINISHED = ("running", "queued", "abandoned")


def shown_runs(runs: list[RunRow], live: set[str]) -> list[RunRow]:
    """What `status` without --run shows: every run not finished (running, queued or abandoned,
    whoever started it), oldest first, then the latest of the others."""
    ordered = sorted(runs, key=lambda r: (r.started or 0.0, r.id))
    unfinished = [r for r in ordered if run_state(r, live) in UNFINISHED]
    ended = [r for r in ordered if run_state(r, live) not in UNFINISHED]
    return unfinished + ended[-1:]


def _status(args: argparse.Namespace, reader: LedgerReader) -> int:
    runs = reader.runs()
    machines, live = reader.machines(), reader.live_owners()
    if args.run is not None:
        chosen = [r for r in runs if r.id == args.run]
        if not chosen:
            return usage_error(f"--run: no run {args.run!r} in this ledger (see `actor-run runs`)")
    else:
        chosen = shown_runs(runs, live)
    now = time.time()
    if args.json:
        out = []
        for run in chosen:
            jobs = reader.jobs(run.id)
            out.append({"kind": "run", **_run_dict(run, live)})
            views = {v.key: v for v in job_views(reader, run.id, jobs, now)}
            for j in jobs:
                v = views[j["key"]]
                out.append({"kind": "job", **{k: v for k, v in j.items() if k != "spec"}, "now": v.state,
                            "place": v.place, "stage": v.stage, "usd_now": v.usd, "attempts": v.attempts,
                            "counts": v.counts, "reason": v.reason})
        for m in machines:
            out.append({"kind": "machine", **msgspec.structs.asdict(m), "owner_alive": m.owner in live})
        for d in out:
            sys.stdout.write(msgspec.json.encode(d).decode() + "\n")
        return Exit.OK
    if not chosen:
        print("no run in the ledger")
    for run in chosen:
        state = run_state(run, live)
        print(f"run {run.id} ({state}), started {_when(run.started)}, batch {run.batch or '-'},"
              f" results in {run.out_dir or '-'}")
        if state == "abandoned":
            print(f"  its controller is gone with {run.unfinished} job(s) unfinished: `actor-run resume {run.id}`"
                  " picks them up")
        for v in job_views(reader, run.id, reader.jobs(run.id), now):
            print("  " + view_line(v))
    alive = [m for m in machines if m.state == "alive"]
    if not alive:
        print(f"no machine alive ({len(machines)} in the ledger, all deleted)")
        return Exit.OK
    print(f"{'machine':<52} {'cloud':<6} {'phase':<14} {'owner':<9} {'run':<9} deadline")
    for m in alive:
        owner = m.owner[:8] + ("" if m.owner in live else " (gone)")
        deadline = time.strftime("%H:%M:%S", time.localtime(m.deadline))
        print(f"{m.name:<52} {m.cloud:<6} {m.phase:<14} {owner:<9} {m.run or '-':<9} {deadline}")
    return Exit.OK
