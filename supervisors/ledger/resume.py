"""Resume: pick up the unfinished jobs of controllers that died.

For each job the ledger holds as running whose owner is gone (claimed with a compare-and-set, so
two resumers never both take it):
- its latest machine whose job was started (or that answered with the start unrecorded: the machine
  is asked) and is still alive in the ledger is adopted and reattached: the heartbeat is taken over
  with the stall clock anchored at the job's launch; a job that finished meanwhile has its results
  fetched, not run again; a job the host's watchdog ended (its folder gone) is retried on a fresh
  machine; one that never started is started on the adopted machine;
- every other machine of the dead owner is left to the sweep that follows, which deletes it;
- a job that never started is started.
Every job then ends exactly once, through the same JobSupervisor as a fresh run.
"""

from __future__ import annotations

import os

import msgspec

from actor_run.actors import Reattach
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import Job, unredacted
from actor_run.supervisors.ledger.reader import LedgerReader, MachineRow


class ResumeItem(msgspec.Struct, frozen=True, kw_only=True):
    job: Job
    from_owner: str
    run: str
    seed_dir: str | None  # where the run said this seed's results go (recorded at its start)
    first_attempt: int
    reattach: Reattach | None = None
    offer: Offer | None = None
    missing_env: tuple[str, ...] = ()  # secret env names the ledger kept out and this process lacks


def _reattachable(rows: list[MachineRow]) -> MachineRow | None:
    """The latest attempt's machine that runs the job, or that answered and may run it: a controller
    killed between the start on the machine and the ledger's record of it leaves a `launched` row
    whose job runs; the attempt that adopts it asks the machine before it starts anything."""
    running = [r for r in rows
               if r.state == "alive" and r.machine and (
                   (r.phase == "running" and r.work and (r.pid or r.handle)) or r.phase == "launched")]
    return max(running, key=lambda r: r.attempt) if running else None


def plan_resume(reader: LedgerReader, *, me: str, run: str | None = None) -> list[ResumeItem]:
    """The unfinished jobs of dead owners, of `run` or of every run, oldest run first. It reads
    those jobs and their machines only, each machine once (a worker adopting a dead worker's 3,000
    jobs compared each with every machine of the batch: 27 million comparisons at 9,000 jobs)."""
    live = reader.live_owners() | {me}
    rows = reader.orphaned_jobs(me=me, run=run)
    by_job: dict[tuple[str, int], list[MachineRow]] = {}
    for m in reader.machines(jobs=[(r["name"], r["seed"]) for r in rows]):
        by_job.setdefault((m.job, m.seed), []).append(m)
    environ = dict(os.environ)
    items = []
    for row in rows:
        if row["owner"] in live:  # (its lease ran out between the two reads: the next call takes it)
            continue
        job, missing = unredacted(msgspec.json.decode(row["spec"], type=Job), environ)
        mine = [m for m in by_job.get((job.name, job.seed), ()) if m.run in (row["run"], None)]
        first = max((m.attempt for m in mine), default=-1) + 1
        best = _reattachable(mine)
        reattach = offer = None
        if best is not None and best.owner not in live:
            assert best.machine is not None
            machine = msgspec.json.decode(best.machine, type=Machine)
            reattach = Reattach(machine=machine, work=best.work or "", pid=best.pid or 0,
                                launched_at=best.launched_at or machine.created_at, handle=best.handle or "")
            offer = msgspec.json.decode(best.offer, type=Offer) if best.offer else None
            first = best.attempt
        items.append(ResumeItem(job=job, from_owner=row["owner"], run=row["run"], seed_dir=row["out_dir"] or None,
                                first_attempt=first, reattach=reattach, offer=offer, missing_env=tuple(missing)))
    return items
