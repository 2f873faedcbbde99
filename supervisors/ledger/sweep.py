"""Orphan sweeps: delete a machine only on proof that nobody needs it.

A machine the provider lists under our prefix goes when one of these holds:
(a) its owner is known to this ledger (an owners row, or the machine's own row) and proven dead:
    closed, or its pid is gone or is another process (start time) on this computer, or silent
    past the beat window elsewhere (ledger.owner_is_alive); on a shared (PostgreSQL) ledger, its
    lease has run out; a machine the ledger marks resumable
    (adopted by a resume) is left to that resume unless (b) or (c) holds;
(b) it is past its deadline + grace, whoever owns it;
(c) the machine itself shows it is abandoned: the newest controller heartbeat stamp its host's
    watchdog reads (`alive` in an attempt's folder) is older than the `lost_after_s` written
    beside it (a controller that silent has given the attempt up; the watchdog ends the job). It
    is read over the machine's host where that answers; no answer is no proof.
Everything else stays. An owner this ledger does not know is someone else's controller (another
ledger on this computer, a teammate's laptop): its machines are *foreign*, listed with their
deadline and the moment (b) takes them. `owners_dead` (`actor-run sweep --owner ID`) is a person's
decision that an owner is dead.

The order matters: the provider's machines are listed FIRST, THEN the owners and the ledger are
read. A machine launched while the sweep runs is not in the list, and its intent's owner is alive
when the owners are read, so neither it nor its ledger row is touched. Ledger rows of machines the
provider no longer lists are closed when their owner is dead (an ambiguous create that made
nothing, a deletion confirmed elsewhere).

A deleted machine's live reservation (budget.py) is charged what the provider's listing says it
cost: its price from its creation to the delete request (or to its preemption).

`decide` is the whole decision as a pure function of what was read; `plan` reads, `sweep` acts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec
import trio

from actor_run.protocols.clouds import Cloud
from actor_run.protocols.failures import ActorRunError, DeleteUnconfirmed
from actor_run.protocols.hosts.workspace import HostBeat
from actor_run.protocols.messages import Machine
from actor_run.protocols.names import PREFIX, parse_name
from actor_run.protocols.offload import to_thread
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger.owners import owner_is_alive
from actor_run.supervisors.ledger.reader import LedgerReader, MachineRow
from actor_run.supervisors.ledger.writer import Ledger

DEFAULT_LOST_AFTER_S = 120.0  # PolicySpec's default: for a stamp written without its window beside it
# the sweep's own floor under any window written beside a stamp: a stamp younger than this is never
# proof, whatever `lost_after` a job (an older actor-run, a hand-edited file, a poll_s above its
# lost_after_s) wrote on its machine
MIN_BEAT_WINDOW_S = 10.0
BEAT_READ_S = 15.0  # how long a machine's host has to answer the stamp read (a sweep waits for the slowest)


# (an open ledger row) -> None when the cloud listed under its key was built from the row's own
# recorded settings, else the hint a person needs (which batch or flag would ask with them)
Proves = Callable[[MachineRow], "str | None"]


class SweepAction(msgspec.Struct, frozen=True, kw_only=True):
    cloud: str
    machine: str
    action: str  # delete | deleted | keep | failed | close | closed
    reason: str
    owner: str = ""
    detail: str = ""
    deadline: float = 0.0  # the machine's deadline (from its name), 0 when unknown
    expires: float = 0.0  # when rule (b) takes it: deadline + grace


class Owners(msgspec.Struct, frozen=True, kw_only=True):
    """What the ledger says of owners, read after the listing: `alive` may hold short (8 hex)
    ids too; `known` are the ids this ledger has an owners row for; `dead` are declared dead."""

    alive: frozenset[str]
    known: frozenset[str]
    dead: frozenset[str] = frozenset()

    def state(self, owner: str, *, in_ledger: bool) -> str:
        """alive | dead | foreign. `in_ledger`: this ledger holds a row of the machine, so its
        owner wrote here: known even without an owners row (then nothing says it lives)."""
        short = owner[:8]
        if owner in self.dead or short in self.dead:
            return "dead"
        if owner in self.alive or short in self.alive:
            return "alive"
        if in_ledger or owner in self.known or short in self.known:
            return "dead"
        return "foreign"


def read_owners(reader: LedgerReader, *, now: float, also_alive: Iterable[str] = (),
                declared_dead: Iterable[str] = ()) -> Owners:
    rows = reader.owners()
    dead = frozenset(declared_dead)
    # a shared ledger's owners live by the leases they renew (the database's clock, one answer for
    # every host); a file's by pid and start time here, by their beat elsewhere
    live = reader.live_owners() if reader.backend.fenced else {o.id for o in rows if owner_is_alive(o, now=now)}
    alive = live | set(also_alive)
    alive = {a for a in alive if a not in dead and a[:8] not in dead}
    return Owners(alive=frozenset(alive | {a[:8] for a in alive}),
                  known=frozenset({o.id for o in rows} | {o.id[:8] for o in rows}), dead=dead)


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    action: str  # delete | keep
    reason: str
    owner: str
    deadline: float
    needs_beat: bool = False  # only (c) could take it: read its host's stamp


def decide(m: Machine, row: MachineRow | None, owners: Owners, *, now: float, grace_s: float,
           beat: HostBeat | None = None, lost_after_s: float = DEFAULT_LOST_AFTER_S) -> Verdict | None:
    """The sweep's decision for one listed machine (pure). None: not one of ours, never touched."""
    parsed = parse_name(m.name)
    if parsed is None and row is None:
        return None
    deadline = float(parsed.deadline) if parsed is not None else (row.deadline if row is not None else 0.0)
    owner = row.owner if row is not None else (parsed.owner if parsed is not None else "")

    def verdict(action: str, reason: str, needs_beat: bool = False) -> Verdict:
        return Verdict(action=action, reason=reason, owner=owner, deadline=deadline, needs_beat=needs_beat)

    if deadline and now > deadline + grace_s:
        return verdict("delete", "past its deadline")
    state = owners.state(owner, in_ledger=row is not None)
    if state == "alive":
        return verdict("keep", "its owner is alive")
    if state == "dead":
        if row is None:
            return verdict("delete", "unknown to the ledger and its owner is gone")
        if row.state == "deleted":
            return verdict("delete", "the ledger says deleted but the provider still lists it")
        if not row.resumable:
            return verdict("delete", "its owner is gone")
    if beat is not None:
        window = max(MIN_BEAT_WINDOW_S, beat.lost_after_s if beat.lost_after_s is not None else lost_after_s)
        if beat.age_s > window:
            return verdict("delete", f"its controller's heartbeat on the host stopped {beat.age_s:.0f} s ago "
                                     f"(lost after {window:.0f} s)")
    if state == "dead":
        return verdict("keep", "left for the resume that adopted it", needs_beat=beat is None)
    return verdict("keep", "foreign owner", needs_beat=beat is None)


def decide_all(listed: dict[str, list[Machine]], rows: list[MachineRow], owners: Owners, *, now: float,
               grace_s: float, beats: dict[str, HostBeat] | None = None,
               lost_after_s: float = DEFAULT_LOST_AFTER_S, unlisted_clouds: frozenset[str] = frozenset(),
               provable: frozenset[str] | None = None, unproven_hint: dict[str, str] | None = None,
               ) -> tuple[list[SweepAction], list[str]]:
    """Every decision of a sweep (pure): an action per listed machine of ours and per open ledger row
    of a dead owner the provider no longer lists; and the machines whose host stamp may decide.

    `provable`: the open rows whose own recorded settings (the same account, the same endpoint, the
    same ssh hosts or sandbox folder) are those of the cloud that was listed under their key (None:
    every row). Only such a row is closed as gone when the provider does not list it; another stays
    open, kept with `unproven_hint[name]` saying what would ask with its own settings (a plain sweep
    built `local` from another run's state_dir and closed a live machine's row)."""
    beats = beats or {}
    by_name = {r.name: r for r in rows}
    actions: list[SweepAction] = []
    ask: list[str] = []
    for cloud, machines in listed.items():
        for m in machines:
            v = decide(m, by_name.get(m.name), owners, now=now, grace_s=grace_s, beat=beats.get(m.name),
                       lost_after_s=lost_after_s)
            if v is None:
                continue
            if v.needs_beat:
                ask.append(m.name)
            actions.append(SweepAction(cloud=cloud, machine=m.name, action=v.action, reason=v.reason, owner=v.owner,
                                       deadline=v.deadline, expires=v.deadline + grace_s if v.deadline else 0.0))
    seen = {m.name for machines in listed.values() for m in machines}
    for row in rows:
        if row.state != "alive" or row.name in seen or row.cloud not in listed or row.cloud in unlisted_clouds:
            continue
        if owners.state(row.owner, in_ledger=True) != "dead":
            continue
        if provable is not None and row.name not in provable:
            actions.append(SweepAction(cloud=row.cloud, machine=row.name, action="keep", reason="not proven gone",
                                       owner=row.owner, deadline=row.deadline, expires=row.deadline + grace_s,
                                       detail=(unproven_hint or {}).get(row.name, "")))
            continue
        actions.append(SweepAction(cloud=row.cloud, machine=row.name, action="close",
                                   reason="the provider no longer lists it", owner=row.owner, deadline=row.deadline,
                                   expires=row.deadline + grace_s))
    return actions, ask


async def read_beat(cloud: Cloud, m: Machine) -> HostBeat | None:
    """The machine's newest controller stamp, over its host; None when it cannot be read (no proof)."""
    try:
        with trio.fail_after(BEAT_READ_S):
            ws = await cloud.connect(m)
            try:
                return await ws.last_beat()
            finally:
                with trio.CancelScope(shield=True):
                    await ws.aclose()
    except (ActorRunError, OSError, trio.TooSlowError):
        return None


async def plan(clouds: dict[str, Cloud], reader: LedgerReader, *, now: float | None = None,
               grace_s: float = 600.0, keep_owner: str | None = None, owners_dead: Iterable[str] = (),
               lost_after_s: float = DEFAULT_LOST_AFTER_S, proves: Proves | None = None,
               ) -> tuple[list[SweepAction], list[tuple[Cloud, Machine]]]:
    listed: dict[str, list[Machine]] = {}
    failed: list[SweepAction] = []
    for name, cloud in clouds.items():
        try:
            listed[name] = await cloud.list_ours(PREFIX)
        except (ActorRunError, OSError) as exc:
            # say so: a cloud we could not list may hold orphans this sweep cannot see
            failed.append(SweepAction(cloud=name, machine="*", action="failed", reason="could not list its machines",
                                      detail=str(exc) or type(exc).__name__))
    unlisted = frozenset(a.cloud for a in failed)
    # AFTER listing: who is alive now, and what the ledger holds (read once, off the reactor)
    t = time.time() if now is None else now
    owners, rows = await to_thread(lambda: (
        read_owners(reader, now=t, also_alive=[keep_owner] if keep_owner else [], declared_dead=owners_dead),
        reader.machines()))
    provable: frozenset[str] | None = None
    hints: dict[str, str] = {}
    if proves is not None:  # which open rows the clouds listed were built for (off the reactor: it reads)
        def judge() -> frozenset[str]:
            names = set()
            for r in rows:
                if r.state == "alive" and r.cloud in listed:
                    hint = proves(r)
                    if hint is None:
                        names.add(r.name)
                    else:
                        hints[r.name] = hint
            return frozenset(names)

        provable = await trio.to_thread.run_sync(judge)
    actions, ask = decide_all(listed, rows, owners, now=t, grace_s=grace_s, lost_after_s=lost_after_s,
                              unlisted_clouds=unlisted, provable=provable, unproven_hint=hints)
    if ask:
        machine_of = {m.name: (clouds[c], m) for c, ms in listed.items() for m in ms}
        beats: dict[str, HostBeat] = {}

        async def read(name: str) -> None:
            beat = await read_beat(*machine_of[name])
            if beat is not None:
                beats[name] = beat

        async with trio.open_nursery() as nursery:
            for name in ask:
                nursery.start_soon(read, name)
        if beats:
            actions, _ = decide_all(listed, rows, owners, now=t, grace_s=grace_s, beats=beats,
                                    lost_after_s=lost_after_s, unlisted_clouds=unlisted, provable=provable,
                                    unproven_hint=hints)
    cloud_of = {m.name: (clouds[c], m) for c, ms in listed.items() for m in ms}
    doomed = [cloud_of[a.machine] for a in actions if a.action == "delete"]
    return failed + actions, doomed


async def reclaimable(machines: list[Machine], ledger_path: str | Path, *, grace_s: float = 600.0,
                      keep_owner: str | None = None) -> list[Machine]:
    """Of machines a cloud just listed, those the sweep's rules let go now (the ledger and the
    owners read after the listing, as `plan` does). A machine only its host's stamp could condemn
    stays: reclaiming frees quota, it does not wait on hosts."""
    def read() -> tuple[Owners, list[MachineRow]]:
        reader = LedgerReader(ledger_path)
        try:
            return (read_owners(reader, now=time.time(), also_alive=[keep_owner] if keep_owner else []),
                    reader.machines())
        finally:
            reader.close()

    owners, rows = await to_thread(read)
    by_name, now = {r.name: r for r in rows}, time.time()
    out = []
    for m in machines:
        v = decide(m, by_name.get(m.name), owners, now=now, grace_s=grace_s)
        if v is not None and v.action == "delete":
            out.append(m)
    return out


async def sweep(clouds: dict[str, Cloud], reader: LedgerReader, ledger: Ledger | None, *, dry_run: bool = False,
                grace_s: float = 600.0, keep_owner: str | None = None, owners_dead: Iterable[str] = (),
                lost_after_s: float = DEFAULT_LOST_AFTER_S, proves: Proves | None = None) -> list[SweepAction]:
    """Plan, then (unless dry_run) delete each doomed machine and record it; returns what happened."""
    actions, doomed = await plan(clouds, reader, grace_s=grace_s, keep_owner=keep_owner, owners_dead=owners_dead,
                                 lost_after_s=lost_after_s, proves=proves)
    if dry_run:
        return actions
    results: dict[str, SweepAction] = {}

    async def delete(cloud: Cloud, m: Machine, action: SweepAction) -> None:
        asked = time.time()  # the provider's bill stops when it gets the delete
        try:
            with trio.fail_after(120):
                await cloud.delete(m.name, m.id)
        except (DeleteUnconfirmed, ActorRunError, OSError, trio.TooSlowError) as exc:
            results[m.name] = msgspec.structs.replace(action, action="failed", detail=str(exc) or type(exc).__name__)
            if ledger is not None:
                await to_thread(ledger.record_delete_failed, m.name, str(exc))
            return
        results[m.name] = msgspec.structs.replace(action, action="deleted")
        if ledger is not None:
            await to_thread(ledger.record_gone, m.name, asked, f"swept: {action.reason}")
            parsed = parse_name(m.name)
            if parsed is not None and m.created_at > 0:  # its reservation, if one is live, is charged now
                end = min(asked, m.taken_at) if m.taken_at > 0 else asked  # a preempted one's bill stopped then
                end = min(end, m.deadline) if m.deadline > 0 else end
                seconds = max(0.0, end - m.created_at)
                row = await to_thread(reader.machine, m.name)
                ledger.record_swept_charge(job=job_key(parsed.job, parsed.seed), attempt=parsed.attempt,
                                           usd=seconds * m.hourly_usd / 3600.0, seconds=seconds,
                                           run=row.run if row is not None else None)

    by_name = {a.machine: a for a in actions}
    async with trio.open_nursery() as nursery:
        for cloud, m in doomed:
            nursery.start_soon(delete, cloud, m, by_name[m.name])
    out = []
    for a in actions:
        if a.machine in results:
            out.append(results[a.machine])
        elif a.action == "close":
            if ledger is not None:
                await to_thread(ledger.record_gone, a.machine, time.time(),
                                              "swept: not listed by the provider")
            out.append(msgspec.structs.replace(a, action="closed"))
        else:
            out.append(a)
    return out
