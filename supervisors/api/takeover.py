"""Takeover: what a Runner takes of other controllers' work: `claim` (the queued jobs of a shared
ledger), `resume` (the unfinished jobs dead controllers left, with the money their runs spent) and
`sweep` (their machines). An object the Runner holds (it holds the ledger, the clouds and the board
of handles, nothing of the Runner), kept apart because it is the one place a Runner acts on other
controllers' work.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from actor_run.actors import Reactor
from actor_run.protocols.clouds import Cloud, accounts_of, cloud_key, split_key
from actor_run.protocols.failures import Code, SpecError
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import Cancel
from actor_run.protocols.specs import Job, job_key, unredacted, without_secrets
from actor_run.supervisors.api.config import build_cloud, settings_digest
from actor_run.supervisors.api.handle import Board, JobHandle
from actor_run.supervisors.api.job_checks import Clouds
from actor_run.supervisors.ledger import Ledger, LedgerReader
from actor_run.supervisors.ledger.reader import MachineRow
from actor_run.supervisors.ledger.resume import ResumeItem, plan_resume
from actor_run.supervisors.ledger.sweep import Proves, SweepAction, sweep
from actor_run.supervisors.tree.batch import Submit
from actor_run.supervisors.tree.budget import Budget
from actor_run.supervisors.tree.reservations import settle_reservations
from actor_run.supervisors.tree.seed_end import seed_dir


class Takeover:
    """`claim` (queued jobs of a shared ledger), `resume` and `sweep`. `driven` is the Runner's set
    of runs it drives (its own and those it resumed: ended at its close); `swept` and `swept_clouds`
    are what the last sweep did and asked."""

    def __init__(self, *, ledger: Ledger, ledger_path: str | Path, owner: str, budget: Budget,
                 budget_usd: float | None, clouds: Clouds, reactor: Reactor, board: Board,
                 sweep_grace_s: float, out_dir: Path, driven: set[str], enqueued: dict[str, Job],
                 cannot_run: set[tuple[str, str]]) -> None:
        self.ledger = ledger
        self.ledger_path = ledger_path
        self.owner = owner
        self.budget = budget
        self.budget_usd = budget_usd
        self.clouds = clouds
        self.reactor = reactor
        self.board = board
        self.sweep_grace_s = sweep_grace_s
        self.out_dir = out_dir
        self.driven = driven
        self.enqueued = enqueued  # the jobs the Runner queued and has not claimed yet, secrets and all
        self.cannot_run = cannot_run  # (run, key) of queued jobs it put back: no cloud of theirs usable here
        self.swept: list[SweepAction] = []
        self.swept_clouds: list[str] = []  # the cloud keys the last sweep() asked

    def claim(self, most: int, run: str | None, *, own_run: str) -> list[JobHandle]:
        """Claim up to `most` queued jobs of `run` (None: of any run) from the ledger and run them
        here, each in its run, its results where that run said; one none of whose clouds can be used
        here (a key this process lacks) goes back to the queue's end, for another worker. A job this
        Runner queued (of `own_run`) runs as it was given (its secret env values too: the ledger
        never had them).
        Of another's, secrets the ledger kept out of its spec come from this process's environment,
        and a job whose batch and submitter named no team budget draws on this process's settings'
        `budget`."""
        clouds = self.clouds
        handles = []
        environ = dict(os.environ)  # once: a copy per job was most of a 3,000-job claim (bench/scaleout.py)
        built: list[tuple[str, dict[str, Any], str, bool]] = []  # the clouds looked at in this claim (job_checks.py)
        cannot: list[tuple[str, str]] = []  # (run, key) of the jobs claimed that no cloud here can run
        for claimed in self.ledger.claim_queued(most, run):
            queued_here = self.enqueued.pop(claimed.key, None) if claimed.run == own_run else None
            if queued_here is not None:  # its own (`run` on a shared ledger): the batch's secrets are here
                job, missing = queued_here, list[str]()
            else:
                job, missing = unredacted(msgspec.json.decode(claimed.spec, type=Job), environ)
                job = clouds.config.job_defaults(job)  # the worker's team budget for a job that names none
            refuse = None
            if missing:  # never run a job with a placeholder where its secret should be, nor rent for it
                refuse = Cancel(failure=Code.INPUT, detail=(
                    f"env {', '.join(missing)} was kept out of the ledger (secret) and is not set for this "
                    "worker: set it in the worker's environment, or list it in job.public_env"))
            differs, unusable = clouds.look_at(job, built)
            for why in differs:
                logger.warning("{}: {}; it leases with the settings this worker has", job.key, why)
            if unusable and all(c.cloud in unusable for c in job.candidates):
                # none of its clouds can be used here (a key this worker lacks): another worker's to run
                cannot.append((claimed.run, claimed.key))
                if (claimed.run, claimed.key) not in self.cannot_run:
                    self.cannot_run.add((claimed.run, claimed.key))
                    logger.warning("{}: left queued for another worker: {}", job.key, "; ".join(unusable.values()))
                continue
            handle = self.board.add(job, claimed.run)
            handles.append(handle)
            folder = claimed.out_dir or str(seed_dir(self.out_dir, claimed.run, job))
            self.board.tell(Submit(job=job, seed_dir=folder, refuse=refuse))
        self.ledger.put_back(cannot)
        return handles

    def resume(self, run: str | None = None, *, sweep_after: bool = True, take_runs: bool = True,
               most_new: int | None = None) -> list[JobHandle]:
        """Take over the unfinished jobs of dead controllers (resume.py): of `run`, or of every run.
        Each job keeps its run: its rows go there and its results to the folder that run recorded.
        Jobs of another run with the key of one taken here are left for a later call. Then the
        dead owners' remaining machines are swept (without `sweep_after`, only if a job was taken:
        a worker's adoption check, every poll). Without `take_runs` (a worker adopting jobs of a
        shared ledger) each run stays its starter's: the worker adopts jobs, not runs. `most_new`: a
        worker's free slots: of the jobs that need a machine launched it takes that many, or its share
        of them (their count over the live owners, itself included) if more, the rest waiting here for
        a slot; a job whose machine runs it is always taken, and watched at once (watching is not a
        slot). None: every job. Main thread (the Runner's caller); LedgerError if the ledger fails."""
        reader = LedgerReader(self.ledger_path)
        try:
            items = plan_resume(reader, me=self.owner, run=run)
            adopters = sorted(reader.live_owners() | {self.owner}) if most_new is not None and items else []
        finally:
            reader.close()
        if most_new is not None:
            items, most_new = _my_share(items, most_new, adopters, self.owner)
        taken: list[tuple[ResumeItem, JobHandle]] = []
        runs: set[str] = set()
        wanted: list[ResumeItem] = []
        keys: set[str] = set()
        for item in items:
            if self.board.running(item.job.key) is not None:
                continue  # one job of that name and seed at a time in one Runner: the next call takes it
            if item.job.key in keys:
                continue  # (the same key in two runs: the next call takes the other)
            if item.reattach is None and most_new is not None:
                if most_new < 1:
                    continue  # left to a worker with a free slot
                most_new -= 1
            wanted.append(item)
            keys.add(item.job.key)
        # one transaction for every claim (another resumer may win some), one for every adoption
        won = self.ledger.claim_jobs([(i.job.key, i.from_owner, i.run) for i in wanted])
        for item in wanted:
            # the team budget of this process's settings for a job whose batch and submitter named none
            item = msgspec.structs.replace(item, job=self.clouds.config.job_defaults(item.job))
            job = item.job
            if job.key not in won:
                continue  # another resumer took it
            if take_runs and item.run not in runs:
                runs.add(item.run)
                self.ledger.take_run(item.run)
                self.driven.add(item.run)
            if item.reattach is not None:
                self.ledger.adopt_machine(item.reattach.machine.name, job.key, wait=False)
            for c in job.candidates:
                raw = job.clouds.get(c.cloud, {})
                for account in accounts_of(self.clouds.config.cloud_settings(c.cloud, raw)):
                    with contextlib.suppress(SpecError):  # one the job needs fails its first lease instead
                        self.clouds.get(cloud_key(c.cloud, account), raw)
            handle = self.board.add(job, item.run)
            handle.reattached = item.reattach is not None
            taken.append((item, handle))
        if taken:
            self.ledger.flush()  # the adoptions are durable before any sweep reads the machines
        if sweep_after or taken:
            self.swept = self.sweep()  # after adopting: what is left of the dead owners goes (and is charged)
        spent_before: dict[str, float] = {}
        if taken:
            self.ledger.flush()
            reader = LedgerReader(self.ledger_path)
            try:
                reservations = reader.reservations()
            finally:
                reader.close()
            spent_before = self._adopt_budget(items=[i for i, _ in taken], reservations=reservations)
        for item, _ in taken:
            refuse = None
            if item.missing_env:
                # a job already running on its machine has its env there: it is watched; one that would
                # start now is never run with a placeholder where its secret should be, nor rented for
                why = (f"env {', '.join(item.missing_env)} was kept out of the ledger (secret) and is not set "
                       "here: set it in this process's environment, or list it in job.public_env")
                if item.reattach is None:
                    refuse = Cancel(failure=Code.INPUT, detail=why)
                else:
                    logger.warning("{}: {} (a retry would need it)", item.job.key, why)
            folder = item.seed_dir or str(seed_dir(self.out_dir, item.run, item.job))
            self.board.tell(Submit(job=item.job, first_attempt=item.first_attempt, reattach=item.reattach,
                                   offer=item.offer, spent_before_usd=spent_before.get(item.job.key, 0.0),
                                   seed_dir=folder, refuse=refuse))
        return [h for _, h in taken]

    def _adopt_budget(self, *, items: list[ResumeItem], reservations: list[dict[str, Any]]) -> dict[str, float]:
        """A resume takes over the money of the runs it took jobs of: what those runs spent counts
        against the budget, and the reservation of an attempt it reattaches to is held again (the
        other machines of dead controllers were swept, and charged then). Answers what each taken
        seed spent before."""
        runs = {i.run for i in items}
        taken = {(i.run, i.job.key) for i in items}
        limits = [i.job.policy.budget_usd for i in items if i.job.policy.budget_usd is not None]
        if limits and self.budget_usd is None:
            self.budget.set_limit(min(limits))
        reattached = {(i.run, i.job.key, i.first_attempt) for i in items if i.reattach is not None}
        per_seed: dict[str, float] = {}
        for r in reservations:
            if r["run"] not in runs:
                continue
            holder = (r["job"], r["attempt"])
            if r["state"] == "live" and (r["run"], r["job"], r["attempt"]) in reattached:
                self.ledger.adopt_reservation(r["job"], r["attempt"])
                self.budget.adopt(holder, r["usd"])
            elif r["state"] == "live":
                self.budget.adopt(holder, r["usd"])  # its machine could not be deleted yet: still held
            else:
                self.budget.spend(r["charged"] or 0.0)
                if (r["run"], r["job"]) in taken:
                    per_seed[r["job"]] = per_seed.get(r["job"], 0.0) + (r["charged"] or 0.0)
        return per_seed

    # --- sweeping ------------------------------------------------------------------------------------

    def sweep(self, *, dry_run: bool = False, owners_dead: Iterable[str] = ()) -> list[SweepAction]:
        """Delete the machines sweep.py proves abandoned (this controller counts as alive);
        `owners_dead`: owner ids (or their 8-hex short form) a person declared dead. It asks every
        cloud it can: those this Runner's jobs use (their merged settings), each in the user's
        config, each the ledger has seen (built from the settings stored there, only to list and
        delete), and the local one."""
        clouds, digests = dict(self.clouds.by_key), dict(self.clouds.digests)
        config = self.clouds.config
        wanted: list[tuple[str, dict[str, Any], str]] = []  # (key, the batch-side table, where it comes from)
        for name, table in config.clouds.items():
            wanted += [(cloud_key(name, account), {}, "your config") for account in accounts_of(table)]
        reader = LedgerReader(self.ledger_path)
        try:
            wanted += [(name, settings, "the ledger") for name, settings in reader.clouds()]
        finally:
            reader.close()
        wanted.append(("local", {}, "the default"))
        for key, table, source in wanted:
            if key in clouds:
                continue
            try:
                clouds[key], digests[key] = build_cloud(key, table, config, self.clouds.state_dir)
            except SpecError as exc:  # e.g. its settings were in a user config not given now
                logger.warning("sweep: cloud {} cannot be built ({}); its machines were not looked at (settings "
                               "from {})", key, exc, source)
        self.swept_clouds = sorted(clouds)
        try:
            return self._sweep_clouds(clouds, digests=digests, dry_run=dry_run, owners_dead=owners_dead)
        finally:
            for key, cloud in clouds.items():
                if self.clouds.by_key.get(key) is not cloud:  # built for this sweep only
                    with contextlib.suppress(Exception):  # closing a client must not stop the sweep's answer
                        self.reactor.call(cloud.aclose, timeout=30)

    def _proves(self, reader: LedgerReader, digests: dict[str, bytes]) -> Proves:
        """Whether the cloud a sweep lists under a row's key was built from that row's own recorded
        settings (its job's `[clouds.<name>]` under the user's config; secrets aside: the ledger
        keeps none), so that "not listed" proves the machine gone. None if so, else what would ask
        with them. A row whose job left no spec (an older ledger) is judged as before: by its key."""
        config = self.clouds.config
        listed = {key: _identity(digest) for key, digest in digests.items()}

        def proves(row: MachineRow) -> str | None:
            own = reader.job_clouds(row.run, job_key(row.job, row.seed))
            if own is None:
                return None
            name, _ = split_key(row.cloud)
            if listed.get(row.cloud) == _identity(settings_digest(row.cloud, config.cloud_settings(name, own.get(
                    name, {})))):
                return None
            runs = {r.id: r for r in reader.runs()}
            batch = runs[row.run].batch if row.run in runs and runs[row.run].batch else "its batch file"
            return (f"{row.cloud} was asked with other settings than run {row.run}'s: its row stays open; "
                    f"`actor-run sweep --batch {batch}` asks with that run's own")

        return proves

    def sweep_new(self, clouds: dict[str, Cloud], digests: dict[str, bytes]) -> None:
        """The start-up sweep of clouds new to this Runner (Clouds.on_new): what it did is added to `swept`."""
        self.swept += self._sweep_clouds(clouds, digests=digests)

    def _sweep_clouds(self, clouds: dict[str, Cloud], *, digests: dict[str, bytes], dry_run: bool = False,
                      owners_dead: Iterable[str] = ()) -> list[SweepAction]:
        """The sweep over `clouds` (by key); each (key, settings) listed is remembered as swept."""
        reader = LedgerReader(self.ledger_path)
        try:
            run = functools.partial(sweep, clouds, reader, self.ledger, dry_run=dry_run,
                                    grace_s=self.sweep_grace_s, keep_owner=self.owner, owners_dead=list(owners_dead),
                                    proves=self._proves(reader, digests))
            actions: list[SweepAction] = self.reactor.call(run, timeout=600)
            if not dry_run:
                self.clouds.swept.update((k, d) for k, d in digests.items() if k in clouds)
                self.ledger.flush()
                settle_reservations(reader, self.ledger, keep_owner=self.owner)
            return actions
        finally:
            reader.close()


def _my_share(items: list[ResumeItem], free: int, adopters: list[str], me: str) -> tuple[list[ResumeItem], int]:
    """A worker's adoption of dead workers' jobs (`Takeover.resume` with `most_new`): every job whose
    machine runs it, and of those needing a machine its free slots' worth or its share (their count
    over the live owners `adopters`, `me` among them), whichever is more: a dead worker's jobs are
    adopted within a poll of its lease's end even when every worker is full (they wait for a slot
    in the adopter's batch, as a resume's do), where they had waited, unadopted, for slots to free.
    Each live owner's share is its own: the jobs needing a machine, in the ledger's order, dealt
    out in turn to the owners in id order, so adopters polling at once claim different jobs; past
    its share a worker with more free slots takes the others. Answers the items in the order to
    take them and how many needing a machine to take."""
    new = [i for i in items if i.reattach is None]
    share = -(-len(new) // max(1, len(adopters)))
    if len(new) <= free or me not in adopters:
        return items, max(free, share)
    mine = adopters.index(me)
    dealt = sorted(range(len(new)), key=lambda n: (n % len(adopters) != mine, n))
    return [i for i in items if i.reattach is not None] + [new[n] for n in dealt], max(free, share)


def _identity(digest: bytes) -> bytes:
    """A cloud's settings digest (config.settings_digest: key, NUL, the merged table) without the
    settings that look secret: what a ledger row's recorded settings can be compared with."""
    key, _, table = digest.partition(b"\0")
    return key + b"\0" + msgspec.json.encode(without_secrets(msgspec.json.decode(table)), order="sorted")
