"""Settling reservations a dead controller left live: its machine is gone (its sweep, or its own
delete that it died before recording the charge of), so the reservation is replaced by what the
machine cost, reckoned as the provider bills it: price x from its creation to its deletion, or to
its preemption if the provider took it first (never past its deadline). A machine the ledger never
saw made (a refused create) cost nothing. A reservation whose machine is still alive stays live: a
resume reattaches to it, or the next sweep deletes it and the next settle charges it."""

from __future__ import annotations

import msgspec

from actor_run.protocols.messages import Machine
from actor_run.protocols.specs import job_key
from actor_run.supervisors.ledger import Ledger, LedgerReader, MachineRow


def machine_cost(row: MachineRow) -> tuple[float, float] | None:
    """What a deleted machine cost, in dollars and seconds; None while it is alive (still billing)."""
    if row.state != "deleted":
        return None
    if not row.machine or row.gone is None:
        return 0.0, 0.0  # never made (the create was refused, or nothing answered it and nothing was listed)
    m = msgspec.json.decode(row.machine, type=Machine)
    end = min(row.gone, m.taken_at) if m.taken_at > 0 else row.gone  # a preempted one's bill stopped then
    end = min(end, m.deadline) if m.deadline > 0 else end
    seconds = max(0.0, end - m.created_at)
    return seconds * m.hourly_usd / 3600.0, seconds


def settle_reservations(reader: LedgerReader, ledger: Ledger, *, keep_owner: str) -> int:
    """Charge the live reservations of dead owners whose machines are gone; answers how many."""
    live = reader.live_owners() | {keep_owner}
    machines = {(r.run, job_key(r.job, r.seed), r.attempt): r for r in reader.machines()}
    settled = 0
    for r in reader.reservations():
        if r["state"] != "live" or r["owner"] in live:
            continue
        row = machines.get((r["run"], r["job"], r["attempt"]))
        cost = (0.0, 0.0) if row is None else machine_cost(row)
        if cost is None:
            continue
        ledger.record_swept_charge(job=r["job"], attempt=r["attempt"], usd=cost[0], seconds=cost[1], run=r["run"])
        settled += 1
    ledger.flush()
    return settled
