"""Orphan sweeps: delete machines no live controller owns, and any of ours past deadline + grace.

The order matters: list the provider's machines FIRST, THEN read the live owners. A machine
launched while the sweep runs belongs to an owner that is alive when the owners are read, so it
is never taken for an orphan. An owner whose liveness cannot be decided counts as alive.

A machine goes when (a) its owner is dead and the ledger does not mark it resumable, (b) it is
past its deadline + grace, whoever owns it, or (c) the ledger never heard of it, its name says it
is ours, and its owner is dead. Ledger rows of machines the provider no longer lists (an
ambiguous create that made nothing, a deletion confirmed elsewhere) are closed when their owner
is dead.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import trio

from actor_run.protocols.clouds import Cloud
from actor_run.protocols.failures import ActorRunError, DeleteUnconfirmed
from actor_run.protocols.messages import Machine
from actor_run.protocols.names import PREFIX, parse_name
from actor_run.supervisors.ledger import Ledger, LedgerReader, MachineRow


class SweepAction(msgspec.Struct, frozen=True, kw_only=True):
    cloud: str
    machine: str
    action: str  # delete | deleted | keep | failed | closed
    reason: str
    owner: str = ""
    detail: str = ""


def _reason(m: Machine, row: MachineRow | None, live_short: set[str], live: set[str], now: float,
            grace_s: float) -> str | None:
    parsed = parse_name(m.name)
    if parsed is not None and now > parsed.deadline + grace_s:
        return "past its deadline"
    if row is not None:
        if row.owner not in live and not row.resumable and row.state == "alive":
            return "its owner is gone"
        if row.state == "deleted" and (parsed is None or parsed.owner not in live_short):
            return "the ledger says deleted but the provider still lists it"
        return None
    if parsed is not None and parsed.owner not in live_short:
        return "unknown to the ledger and its owner is gone"
    return None


async def plan(clouds: dict[str, Cloud], reader: LedgerReader, *, now: float | None = None,
               grace_s: float = 600.0, keep_owner: str | None = None,
               ) -> tuple[list[SweepAction], list[tuple[Cloud, Machine]]]:
    listed: dict[str, list[Machine]] = {}
    actions: list[SweepAction] = []
    unlisted_clouds: set[str] = set()
    for name, cloud in clouds.items():
        try:
            listed[name] = await cloud.list_ours(PREFIX)
        except (ActorRunError, OSError) as exc:
            # say so: a cloud we could not list may hold orphans this sweep cannot see
            unlisted_clouds.add(name)
            actions.append(SweepAction(cloud=name, machine="*", action="failed", reason="could not list its machines",
                                       detail=str(exc) or type(exc).__name__))
    # AFTER listing: who is alive now, and what the ledger holds (read once, off the reactor)
    live, rows = await trio.to_thread.run_sync(lambda: (reader.live_owners(), reader.machines()))
    if keep_owner:
        live.add(keep_owner)
    live_short = {o[:8] for o in live}
    by_name = {r.name: r for r in rows}
    now = time.time() if now is None else now
    doomed: list[tuple[Cloud, Machine]] = []
    for name, machines in listed.items():
        for m in machines:
            row = by_name.get(m.name)
            reason = _reason(m, row, live_short, live, now, grace_s)
            parsed = parse_name(m.name)
            owner = row.owner if row else (parsed.owner if parsed else "")
            if reason is None:
                actions.append(SweepAction(cloud=name, machine=m.name, action="keep", reason="its owner is alive",
                                           owner=owner))
            else:
                actions.append(SweepAction(cloud=name, machine=m.name, action="delete", reason=reason, owner=owner))
                doomed.append((clouds[name], m))
    seen = {m.name for machines in listed.values() for m in machines}
    for row in rows:
        if row.state != "alive" or row.name in seen or row.cloud not in clouds or row.cloud in unlisted_clouds:
            continue
        if row.owner in live:
            continue
        actions.append(SweepAction(cloud=row.cloud, machine=row.name, action="close",
                                   reason="the provider no longer lists it", owner=row.owner))
    return actions, doomed


async def reclaimable(machines: list[Machine], ledger_path: Path, *, grace_s: float = 600.0,
                      keep_owner: str | None = None) -> list[Machine]:
    """Of machines a cloud just listed, those the sweep's rules let go (owners read after the list)."""
    def read() -> tuple[set[str], list[MachineRow]]:
        reader = LedgerReader(ledger_path)
        try:
            return reader.live_owners(), reader.machines()
        finally:
            reader.close()

    live, rows = await trio.to_thread.run_sync(read)
    if keep_owner:
        live.add(keep_owner)
    live_short, by_name, now = {o[:8] for o in live}, {r.name: r for r in rows}, time.time()
    return [m for m in machines if _reason(m, by_name.get(m.name), live_short, live, now, grace_s) is not None]


async def sweep(clouds: dict[str, Cloud], reader: LedgerReader, ledger: Ledger | None, *, dry_run: bool = False,
                grace_s: float = 600.0, keep_owner: str | None = None) -> list[SweepAction]:
    """Plan, then (unless dry_run) delete each doomed machine and record it; returns what happened."""
    actions, doomed = await plan(clouds, reader, grace_s=grace_s, keep_owner=keep_owner)
    if dry_run:
        return actions
    results: dict[str, SweepAction] = {}

    async def delete(cloud: Cloud, m: Machine, action: SweepAction) -> None:
        try:
            with trio.fail_after(120):
                await cloud.delete(m.name, m.id)
        except (DeleteUnconfirmed, ActorRunError, OSError, trio.TooSlowError) as exc:
            results[m.name] = msgspec.structs.replace(action, action="failed", detail=str(exc) or type(exc).__name__)
            if ledger is not None:
                await trio.to_thread.run_sync(ledger.record_delete_failed, m.name, str(exc))
            return
        results[m.name] = msgspec.structs.replace(action, action="deleted")
        if ledger is not None:
            await trio.to_thread.run_sync(ledger.record_gone, m.name, time.time(), f"swept: {action.reason}")

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
                await trio.to_thread.run_sync(ledger.record_gone, a.machine, time.time(),
                                              "swept: not listed by the provider")
            out.append(msgspec.structs.replace(a, action="closed"))
        else:
            out.append(a)
    return out
