"""What a job leaves in its seed's folder when it ends: the outputs of the attempt that ran (tidied)
and `response.json`, the job's own account of its attempts, money, time and exit (JobSupervisor
writes it through the ledger's fence, so a controller that lost the job writes none)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.failures import Code
from actor_run.protocols.messages import AttemptEnded
from actor_run.protocols.specs import Job


def seed_dir(out_root: Path, run: str, job: Job) -> Path:
    """Where a job of run `run` keeps its results: `<out>/<run>/<job>/seed-<n>` (the one rule: a
    batch run again never writes over the last run's; `<out>/latest` names the newest run)."""
    return out_root / run / job.name / f"seed-{job.seed}"

def tidy_seed_dir(seed_dir: Path, history: list[dict[str, Any]], *, checkpoint: bool = True) -> Path:
    """At a job's end: the seed's out/ and progress.jsonl are the last attempt's, which its fetch
    brought there (a failed job's partial outputs too). If the last attempt never ran to its exit
    but an earlier one did (that one's fetch failed, so it was retried), what the earlier one
    brought goes. What a run before this job left stays unless a fetch replaced it. The resume
    checkpoint goes. `checkpoint=False`: the caller knows there is none (a folder its job made,
    into which none of its attempts asked for one): not looked for, a system call spared per job."""
    ran = ["run" in h["phases"] for h in history]
    if ran and not ran[-1] and any(ran):
        shutil.rmtree(seed_dir / "out", ignore_errors=True)
        (seed_dir / "progress.jsonl").unlink(missing_ok=True)
    if checkpoint:
        folder = seed_dir / ".checkpoint"
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
    return seed_dir


def attempt_record(e: AttemptEnded) -> dict[str, Any]:
    """An ended attempt as the job's history keeps it (what response.json's `attempts` list)."""
    o = e.offer
    return {"attempt": e.attempt, "outcome": e.outcome, "failure": e.failure, "detail": e.detail,
            "cloud": o.cloud if o else "", "region": o.region if o else "", "gpu": o.gpu if o else "",
            "phases": e.phases, "usd": e.usage.usd, "usd_at_least": e.usage.at_least, "exit_code": e.exit_code,
            "reason": e.reason}


def response_json(job: Job, outcome: str, failure: Code | None, detail: str, history: list[dict[str, Any]],
                  usd: float, started: float, counts: dict[str, Any] | None = None) -> bytes:
    """`response.json` of a job that ended `outcome` after the attempts in `history`, `started`
    (time.time()) when its supervisor started: indented JSON. `counts`: each retry budget's count
    against its limit (`{"preemptions": {"used": 3, "limit": 5}, ...}`, policy.py `counts`)."""
    exit_code = None
    for h in reversed(history):
        if h.get("exit_code") is not None:
            exit_code = h["exit_code"]
            break
    response = {
        "job": job.name, "seed": job.seed, "outcome": outcome,
        "failure": str(failure) if failure else None, "detail": detail,
        "attempts": history, "usd": round(usd, 6),
        "usd_at_least": any(h["usd_at_least"] for h in history),
        "seconds": round(time.time() - started, 3),
        "phases": _sum_phases(history), "exit_code": exit_code, "counts": counts or {},
    }
    return msgspec.json.format(msgspec.json.encode(response))


def _sum_phases(history: list[dict[str, Any]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for h in history:
        for k, v in h["phases"].items():
            total[k] = round(total.get(k, 0.0) + v, 3)
    return total
