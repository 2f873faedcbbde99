"""A run's report, its figures: what the ledger recorded of one run, gathered into a `Report`: each
job's state, cost and log, its attempts (place, candidate, outcome, failure, cost, machine time and
phases), its resume gaps, and the batch's budget and reservations. report_page.py draws the page.

`build(run, jobs, events, reservations=, owned=)` reads what the ledger recorded (events are the
same structs the actors emit). Phases are cut from the events' times: lease from
`AttemptStarted` to `Leased` (or `LeaseFailed`), upload to `Uploaded`, run to `Exited` (or
`Stalled`), fetch to `Fetched`, release from the end of the last phase to `Released`. A resume's
gap is where the owner of a job's events changes, from the dead controller's last event to the
adopter's first (no controller watched the job in between).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import msgspec

from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    Event,
    Exited,
    Fetched,
    JobEnded,
    Leased,
    LeaseFailed,
    Released,
    Stalled,
    TransferFailed,
    Uploaded,
)
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger import UNCOUNTED, money_by_job

PHASES = ("lease", "upload", "run", "fetch", "release")


class Span(msgspec.Struct, frozen=True, kw_only=True):
    phase: str
    t0: float
    t1: float


class AttemptRow(msgspec.Struct, kw_only=True):
    attempt: int
    cloud: str = ""
    region: str = ""
    gpu: str = ""
    candidate: int = 0
    started: float = 0.0
    ended: float | None = None
    outcome: str = ""
    failure: str = ""
    detail: str = ""
    usd: float = 0.0
    seconds: float = 0.0
    spans: list[Span] = msgspec.field(default_factory=list)
    log_cut: int = 0  # bytes of the job's log cut from the middle of log.txt (Exited's; 0: whole)
    progress_dropped: int = 0  # progress lines never emitted (Exited's or Stalled's)

    @property
    def place(self) -> str:
        return " ".join(x for x in (self.cloud, self.region, self.gpu) if x)


class JobRow(msgspec.Struct, kw_only=True):
    key: str
    state: str = "running"
    failure: str = ""
    detail: str = ""
    usd: float = 0.0
    log: str = ""  # the seed's log.txt (every attempt's part of it, each under its header), "" if unknown
    gaps: list[Gap] = msgspec.field(default_factory=list)
    attempts: list[AttemptRow] = msgspec.field(default_factory=list)

    @property
    def used(self) -> int:
        """The attempts it used: walk steps (a place without stock, an account out of quota) left out."""
        return sum(1 for a in self.attempts if a.failure not in UNCOUNTED)


class Gap(msgspec.Struct, frozen=True, kw_only=True):
    """A resume's gap: from a dead controller's last event of a job to the adopter's first."""
    t0: float
    t1: float
    attempt: int


class Money(msgspec.Struct, frozen=True, kw_only=True):
    """The batch's budget (None: none was set) and its reservations (budget.py), from the ledger."""
    budget_usd: float | None = None
    reservations: int = 0
    reserved_usd: float = 0.0  # set aside before each lease
    charged_usd: float = 0.0  # what the released ones were charged
    held: int = 0  # live: the machine not gone yet
    held_usd: float = 0.0


class Report(msgspec.Struct, kw_only=True):
    run: str
    batch: str = ""
    out_dir: str = ""
    started: float = 0.0
    ended: float = 0.0
    money: Money = msgspec.field(default_factory=Money)
    jobs: list[JobRow] = msgspec.field(default_factory=list)


class _Marks:
    """What one attempt's events said, by kind, as they came."""

    def __init__(self, row: AttemptRow) -> None:
        self.row = row
        self.at: dict[str, float] = {}

    def mark(self, name: str, t: float) -> None:
        self.at.setdefault(name, t)

    def spans(self) -> list[Span]:
        at = self.at
        out: list[Span] = []
        begin = at.get("begin")
        edges = [("lease", "begin", ("leased", "lease_failed")), ("upload", "leased", ("uploaded", "transfer_failed")),
                 ("run", "uploaded", ("exited", "stalled")), ("fetch", "exited", ("fetched",))]
        last = begin
        for phase, start, ends in edges:
            t0 = at.get(start)
            t1 = next((at[e] for e in ends if e in at), None)
            if t0 is None:
                continue
            if t1 is None:  # the phase was cut short (a cancel, a stall the events do not show): to the release
                t1 = at.get("released", at.get("ended", t0))
            out.append(Span(phase=phase, t0=t0, t1=max(t0, t1)))
            last = max(last or t1, t1)
        if "released" in at and last is not None:
            out.append(Span(phase="release", t0=min(last, at["released"]), t1=at["released"]))
        return out


def build(run: dict[str, Any], jobs: list[dict[str, Any]], events: Iterable[Event], *,
          reservations: Iterable[dict[str, Any]] = (), owned: Iterable[dict[str, Any]] = ()) -> Report:
    """The report of one run from its ledger rows: `run` (id, batch, out_dir, started, ended), its
    `jobs` rows and its `events` in the order they were recorded; its `reservations` rows (the
    budget and the money set aside), and `owned`: the events' rows (job, attempt, owner, t) in the
    order they were recorded, whose change of owner marks a resume's gap."""
    rows = {j["key"]: JobRow(key=j["key"], state="canceled" if j["failure"] == "canceled" else j["state"] or "running",
                             failure=j["failure"] or "", detail=j["detail"] or "", usd=j["usd"] or 0.0,
                             log=os.path.join(j["out_dir"], "log.txt") if j.get("out_dir") else "") for j in jobs}
    marks: dict[tuple[str, int], _Marks] = {}
    first, last = float("inf"), 0.0
    for e in events:
        key = job_key(e.job, e.seed)
        job = rows.setdefault(key, JobRow(key=key))
        first, last = min(first, e.t), max(last, e.t)
        if isinstance(e, JobEnded):
            job.state = e.outcome
            job.failure, job.detail, job.usd = str(e.failure or ""), e.detail, e.usd
            continue
        m = marks.get((key, e.attempt))
        if m is None:
            if not isinstance(e, AttemptStarted):
                continue  # an attempt the ledger holds no start of (not recorded): nothing to draw from
            row = AttemptRow(attempt=e.attempt, cloud=e.offer.cloud, region=e.offer.region or e.offer.host,
                             gpu=e.offer.gpu, candidate=e.offer.candidate, started=e.t)
            m = marks[(key, e.attempt)] = _Marks(row)
            job.attempts.append(row)
            m.mark("begin", e.t)
            continue
        match e:
            case Leased():
                m.mark("leased", e.t)
            case LeaseFailed():
                m.mark("lease_failed", e.t)
            case Uploaded():
                m.mark("uploaded", e.t)
            case TransferFailed():
                m.mark("transfer_failed", e.t)
            case Exited(log_cut=cut, progress_dropped=dropped):
                m.mark("exited", e.t)
                m.row.log_cut, m.row.progress_dropped = cut, dropped
            case Stalled(progress_dropped=dropped):
                m.mark("stalled", e.t)
                m.row.progress_dropped = dropped
            case Fetched():
                m.mark("fetched", e.t)
            case Released():
                m.mark("released", e.t)
            case AttemptEnded(outcome=outcome, failure=failure, detail=detail, usage=usage):
                m.mark("ended", e.t)
                m.row.ended, m.row.outcome = e.t, outcome
                m.row.failure, m.row.detail = str(failure or ""), detail
                m.row.usd, m.row.seconds = usage.usd, usage.seconds
            case _:
                pass
    for m in marks.values():
        m.row.spans = m.spans()
    reservations = list(reservations)
    for key, paid in money_by_job(reservations).items():  # one cost figure: the charges `actor-run cost` adds up
        if key in rows:
            rows[key].usd = paid.charged_usd
    started = run.get("started") or (first if first != float("inf") else 0.0)
    ended = run.get("ended") or last or started
    _gaps(rows, owned)
    ordered = sorted(rows.values(), key=lambda j: _order(j.key))
    return Report(run=str(run.get("id", "")), batch=str(run.get("batch") or ""), out_dir=str(run.get("out_dir") or ""),
                  started=min(started, first), ended=max(ended, last), money=_money_of(reservations), jobs=ordered)


def _gaps(rows: dict[str, JobRow], owned: Iterable[dict[str, Any]]) -> None:
    """Each job's resume gaps: where the owner of its events changes, from the old owner's last event
    to the new one's first (no controller watched the job in between)."""
    last: dict[str, tuple[str, float]] = {}
    for e in owned:
        key, owner, t = e["job"], e["owner"] or "", float(e["t"])
        before = last.get(key)
        if before is not None and owner and before[0] and owner != before[0] and key in rows:
            rows[key].gaps.append(Gap(t0=before[1], t1=max(before[1], t), attempt=int(e["attempt"] or 0)))
        last[key] = (owner, t)


def _money_of(reservations: Iterable[dict[str, Any]]) -> Money:
    limits, n, reserved, charged, held, held_usd = [], 0, 0.0, 0.0, 0, 0.0
    for r in reservations:
        n += 1
        reserved += r["usd"] or 0.0
        if r["limit_usd"] is not None:
            limits.append(float(r["limit_usd"]))
        if r["state"] == "live":
            held, held_usd = held + 1, held_usd + (r["usd"] or 0.0)
        else:
            charged += r["charged"] or 0.0
    return Money(budget_usd=limits[-1] if limits else None, reservations=n, reserved_usd=reserved,
                 charged_usd=charged, held=held, held_usd=held_usd)


def _order(key: str) -> tuple[str, int]:
    name, _, seed = key.rpartition("/seed-")
    return (name, int(seed)) if seed.isdigit() else (key, 0)
