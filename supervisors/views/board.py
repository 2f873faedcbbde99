"""What the dashboard shows, read from a ledger (SQLite or PostgreSQL) by any process: every run, a
run's jobs (state, stage, progress, place, attempt, cost), a job's attempts and log tail, the
machines alive and each controller's lease. Plain data (dicts ready for JSON); no HTTP here.

`Board.snapshot()` is called about once a second by each open page's stream: it reads a run's new
events only (`events.id` after the last one seen, kept per run), so its cost follows what changed,
not how long the run has been going.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

from actor_run.protocols.messages import is_waiting, waiting_words
from actor_run.supervisors.ledger import LedgerReader, RunRow, owner_is_alive

LOG_TAIL_BYTES = 16 * 1024  # what a page shows of a job's log (the newest part)
WAITS = ("LeaseStage", "WaitingForCapacity", "AttemptStarted", "Leased", "LeaseFailed", "AttemptEnded", "JobEnded")


def run_state(run: RunRow, live: set[str]) -> str:
    """running, queued (a shared ledger's jobs waiting for a worker), abandoned (unfinished, its
    controller gone: `actor-run resume` takes it), succeeded, failed, or empty (no job)."""
    if run.unfinished:
        if (run.owner in live and run.state == "running") or run.held:
            return "running"
        return "queued" if run.queued else "abandoned"
    if run.jobs == 0:
        return "running" if run.owner in live and run.state == "running" else "empty"
    return "failed" if run.failed else "succeeded"


class _RunEvents:
    """What a run's events say of each job, read incrementally: its stage, its newest progress line,
    what it waits on (booting, waiting for ssh, waiting for capacity or for a team budget)."""

    def __init__(self) -> None:
        self.last_id = 0
        self.stage: dict[str, str] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.waits: dict[str, str] = {}

    def read(self, reader: LedgerReader, run: str) -> None:
        for row in reader.new_events(run, self.last_id):
            self.last_id = max(self.last_id, int(row["id"]))
            kind, job = row["type"], row["job"]
            if kind == "Progress":
                body = json.loads(row["body"])
                self.stage[job] = str(body.get("stage") or "")
                line = body.get("line")
                if isinstance(line, dict):
                    self.progress[job] = line
            elif kind == "LeaseStage":
                self.waits[job] = str(json.loads(row["body"]).get("stage", ""))
            elif kind == "WaitingForCapacity":
                self.waits[job] = waiting_words(json.loads(row["body"]))
            elif kind in WAITS:
                self.waits.pop(job, None)
                if kind == "AttemptStarted":
                    self.progress.pop(job, None)  # a new attempt starts its bar again
                    self.stage.pop(job, None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class Board:
    """The dashboard's reading of one ledger. Not thread-safe: one per stream, or used under a lock."""

    def __init__(self, ledger: str | Path) -> None:
        self.ledger = ledger
        self._events: dict[str, _RunEvents] = {}

    def snapshot(self, run: str | None = None) -> dict[str, Any]:
        """Every run, the jobs of `run` (default: the newest running run, else the newest), the
        machines alive, the controllers (owners) and their leases."""
        now = time.time()
        reader = LedgerReader(self.ledger)
        try:
            live = reader.live_owners()
            rows = reader.runs()
            reserved: dict[str, float] = {}
            for r in reader.reservations():
                if r["state"] == "live":
                    reserved[r["run"]] = reserved.get(r["run"], 0.0) + float(r["usd"] or 0.0)
            budgets = reader.run_budgets()
            runs = [{"id": r.id, "batch": r.batch or "", "started": r.started, "ended": r.ended,
                     "state": run_state(r, live), "jobs": r.jobs, "succeeded": r.succeeded, "failed": r.failed,
                     "left": r.unfinished, "usd": r.usd, "reserved": reserved.get(r.id, 0.0),
                     "budget": budgets.get(r.id)} for r in rows]
            if run is None:
                running = [r.id for r in rows if run_state(r, live) == "running"]
                run = (running or [r.id for r in rows])[-1] if rows else None
            machines = reader.machines(alive_only=True)
            jobs = self._jobs(reader, run, machines, now) if run else []
            owners = [{"id": o.id, "short": o.id[:8], "host": o.host, "pid": o.pid, "alive": o.id in live,
                       "lease_until": o.lease_until, "beat": o.beat}
                      for o in reader.owners() if not o.closed and owner_is_alive(o, now=now)]
        finally:
            reader.close()
        return {
            "now": now, "run": run, "runs": runs[::-1], "jobs": jobs, "owners": owners,
            "machines": [{"name": m.name, "cloud": m.cloud, "region": m.region or "", "job": f"{m.job}/seed-{m.seed}",
                          "attempt": m.attempt, "deadline": m.deadline, "hourly_usd": m.hourly_usd or 0.0,
                          "run": m.run or ""} for m in machines],
        }

    def _jobs(self, reader: LedgerReader, run: str, machines: list[Any], now: float) -> list[dict[str, Any]]:
        seen = self._events.setdefault(run, _RunEvents())
        seen.read(reader, run)
        attempts: dict[str, list[dict[str, Any]]] = {}
        for a in reader.attempts(run):
            attempts.setdefault(a["job"], []).append(a)
        alive: dict[tuple[str, int], Any] = {}
        for m in machines:
            if m.run == run and ((m.job, m.seed) not in alive or m.attempt > alive[(m.job, m.seed)].attempt):
                alive[(m.job, m.seed)] = m
        out = []
        for j in reader.jobs(run, spec=False):
            key, ended = j["key"], attempts.get(j["key"], [])
            spent = sum(a["usd"] or 0.0 for a in ended)
            m = alive.get((j["name"], j["seed"]))
            state, place, usd, stage = j["state"], "", j["usd"] or spent, ""
            if state == "failed" and j["failure"] == "canceled":
                state = "canceled"
            if j["state"] == "running":
                if m is not None:
                    place = " ".join(x for x in (m.cloud, m.region or "") if x)
                    state = "running" if m.phase == "running" else "starting"
                    usd = spent + (m.hourly_usd or 0.0) * max(0.0, now - (m.launched_at or m.created)) / 3600
                    stage = seen.stage.get(key, "")
                else:
                    state = "waiting" if ended or is_waiting(seen.waits.get(key, "")) else "queued"
                stage = seen.waits.get(key, stage)
            line = seen.progress.get(key, {}) if j["state"] == "running" else {}
            out.append({"key": key, "name": j["name"], "seed": j["seed"], "state": state, "stage": stage,
                        "step": _number(line.get("step")), "total": _number(line.get("total")),
                        "place": place, "attempt": (m.attempt if m is not None else len(ended)),
                        "attempts": j["attempts"] or len(ended), "usd": usd,
                        "failure": j["failure"] or "", "detail": j["detail"] or "", "out_dir": j["out_dir"] or ""})
        return out

    def job(self, run: str, key: str) -> dict[str, Any] | None:
        """One job of `run`: its attempts (place, state, failure, cost) in order, and its log's tail."""
        reader = LedgerReader(self.ledger)
        try:
            found = [j for j in reader.jobs(run, spec=False) if j["key"] == key]
            if not found:
                return None
            attempts = [a for a in reader.attempts(run) if a["job"] == key]
        finally:
            reader.close()
        j = found[0]
        return {"key": key, "run": run, "state": j["state"], "failure": j["failure"] or "",
                "detail": j["detail"] or "",
                "attempts": [{"attempt": a["attempt"], "cloud": a["cloud"] or "", "region": a["region"] or "",
                              "state": a["state"] or "", "failure": a["failure"] or "", "detail": a["detail"] or "",
                              "started": a["started"], "ended": a["ended"], "usd": a["usd"] or 0.0}
                             for a in attempts],
                "log": log_tail(Path(j["out_dir"]) / "log.txt") if j["out_dir"] else ""}


def log_tail(path: Path, most: int = LOG_TAIL_BYTES) -> str:
    """The newest `most` bytes of a log (from a whole line), as text; empty when there is none."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - most))
            data = f.read()
    except OSError:
        return ""
    if size > most:
        data = data[data.find(b"\n") + 1:]
    return data.decode("utf-8", "replace")


def as_json(value: Any) -> bytes:
    return msgspec.json.encode(value)
