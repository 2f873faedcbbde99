"""Reconciliation: what actor-run says a batch cost against what the provider billed.

    python bench/cost_reconcile.py [--seeds N] [--concurrency C] [--budget USD] [--job-seconds S]
                                   [--hourly USD] [--json]

A batch of N seeds runs through the real Runner on the `sim` cloud with virtual machines, with
failed launches, machines that never answer and preemptions injected (so there are retries and
money spent on failures), under a budget that holds about a third of the attempts at once. Then
`actor-run cost`'s figures (supervisors/cli/cost.py, read from the ledger) are set beside the
sim's own bill (billing.jsonl: per machine, per second, as a provider bills):

- `bill_usd` / `ours_usd`: the totals; `diff_usd` = ours - bill; `ratio` = ours / bill (target 1,
  and |diff| under a cent);
- `worst_machine_usd`: the largest difference of one machine's charge from its bill line;
- `peak_committed_usd`: the highest reserved + spent at any change, replayed from the ledger's
  reservation rows (never above `budget_usd`);
- `machines`, `attempts`, `failed_usd` (spent on attempts that did not succeed), and the jobs'
  outcomes.

Times are `--scale` times shorter than a real batch's and prices as many times higher, so the
dollars are a real batch's (the default: 3 s jobs for 30 min ones, an H100 at $2.9 an hour).
The last line is one JSON object with these figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from actor_run.protocols.clouds.sim import billing
from actor_run.protocols.names import parse_name
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.cli.cost import cost_rows
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.tree.budget import to_micro


def peak_committed(rows: list[dict]) -> float:
    changes: dict[int, tuple[int, int]] = {}
    for r in rows:
        changes[r["seq"]] = (to_micro(r["usd"]), 0)
        if r["state"] == "released" and r["released_seq"] is not None:
            changes[r["released_seq"]] = (-to_micro(r["usd"]), to_micro(r["charged"]))
    reserved = spent = peak = 0
    for seq in sorted(changes):
        reserved, spent = reserved + changes[seq][0], spent + changes[seq][1]
        peak = max(peak, reserved + spent)
    return peak / 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=60)
    p.add_argument("--job-seconds", type=float, default=3.0)
    p.add_argument("--hourly", type=float, default=2.9, help="the machine's price (an H100)")
    p.add_argument("--scale", type=float, default=600.0,
                   help="times are this many times shorter than real ones, prices this many times higher (a 3 s job"
                        " stands for a 30 min one), so the money is what a real batch spends")
    p.add_argument("--budget", type=float, default=None, help="default: what a third of the seeds would reserve")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    hourly = a.hourly * a.scale
    timeout_s, grace = a.job_seconds * 4, 10.0
    per_attempt = hourly * (timeout_s + grace) / 3600
    budget = a.budget if a.budget is not None else round(per_attempt * a.seeds / 3, 4)
    tmp = Path(tempfile.mkdtemp(prefix="actor-run-cost-"))
    sim = {
        "state_dir": str(tmp / "sim"), "virtual": True, "virtual_job_s": a.job_seconds, "launch_latency_s": 0.5,
        "delete_latency_s": 0.1, "launch_failure_rate": 0.05, "boot_failure_rate": 0.05, "preempt_rate": 0.1,
        "preempt_within_s": a.job_seconds * 2,
        "regions": [{"name": "us-east", "gpus": {"H100": {"stock": a.seeds * 2, "hourly_usd": hourly}}}],
    }
    policy = PolicySpec(poll_s=0.5, setup_grace_s=grace, stall_after_s=30, lost_after_s=30, backoff_s=0.1,
                        backoff_max_s=0.5, max_attempts=6, thrash_max=100, budget_usd=budget)
    jobs = [Job(name="recon", command="train", seed=s, timeout_s=timeout_s, policy=policy,
                candidates=[CandidateSpec(cloud="sim", gpu="H100")], clouds={"sim": sim}) for s in range(a.seeds)]
    t0 = time.monotonic()
    with Runner(out_dir=tmp / "out", state_dir=tmp / "state", concurrency=a.concurrency, budget_usd=budget,
                meter_period_s=1.0) as r:
        handles = [r.submit(j) for j in jobs]
        ended = [h.result(600) for h in handles]
    wall = time.monotonic() - t0
    reader = LedgerReader(tmp / "state" / "ledger.sqlite")
    try:
        rows, machines = reader.reservations(), reader.machines()
    finally:
        reader.close()
    _, total, _ = cost_rows(rows, machines, run="recon")
    bill = billing(tmp / "sim")
    bill_usd = sum(b.usd for b in bill)
    by_attempt = {(f"{n.job}/seed-{n.seed}", n.attempt): b.usd for b in bill if (n := parse_name(b.name))}
    worst = max((abs((row["charged"] or 0.0) - by_attempt.get((row["job"], row["attempt"]), 0.0)) for row in rows),
                default=0.0)
    outcomes = Counter(e.failure or "succeeded" for e in ended)
    out = {
        "seeds": a.seeds, "concurrency": a.concurrency, "budget_usd": budget, "machines": len(bill),
        "attempts": total.attempts, "bill_usd": round(bill_usd, 6), "ours_usd": total.spent_usd,
        "diff_usd": round(total.spent_usd - bill_usd, 6),
        "ratio": round(total.spent_usd / bill_usd, 6) if bill_usd else 1.0,
        "worst_machine_usd": round(worst, 6), "failed_usd": total.failed_usd,
        "peak_committed_usd": round(peak_committed(rows), 6), "outcomes": dict(outcomes), "wall_s": round(wall, 1),
    }
    if not a.json:
        print(f"{'figure':<28} value")
        for k, v in out.items():
            print(f"{k:<28} {v}")
    print(json.dumps(out))
    ok = abs(out["diff_usd"]) < 0.005 and out["peak_committed_usd"] <= budget
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
