"""Reservations in a running batch (supervisors/tree/budget.py, job.py, actors/meter.py's guard): the
sum of live reservations and spend never passes the budget, a job that finds no offer its money
can hold ends `budget` without renting, and an attempt outrunning its estimate is stopped at its
reservation with its machine deleted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from actor_run.protocols.clouds.sim import billing, sim_machines
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import Charged, Reserved
from actor_run.supervisors.ledger import LedgerReader
from actor_run.supervisors.tree.budget import MICRO, to_micro


def replay(rows: list[dict[str, Any]]) -> list[int]:
    """Reserved + spent after every change, in micro-dollars, from the ledger's reservation rows
    alone: +usd at a row's `seq`, then -usd + charged at its `released_seq`."""
    changes: dict[int, tuple[int, int]] = {}  # seq -> (change in reserved, change in spent)
    for r in rows:
        changes[r["seq"]] = (to_micro(r["usd"]), 0)
        if r["state"] == "released":
            changes[r["released_seq"]] = (-to_micro(r["usd"]), to_micro(r["charged"]))
    assert sorted(changes) == list(range(1, len(changes) + 1))  # every change is in the ledger
    reserved = spent = 0
    out = []
    for seq in sorted(changes):
        dr, ds = changes[seq]
        reserved, spent = reserved + dr, spent + ds
        out.append(reserved + spent)
    return out


def test_fifty_seeds_twenty_at_once_never_reserve_past_the_budget(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, sim_dir: Path, state_dir: Path,
) -> None:
    # $1 a second; each attempt may hold its machine 2 s + 1 s of setup grace: $3 reserved each, and
    # a $30 budget holds 10 at once. A virtual job runs 0.3 s, so each charge frees most of its $3
    sim = {"regions": regions(("r", "A100", 100, 3600.0)), "virtual": True, "virtual_job_s": 0.3}
    jobs = [sim_job("many", "train", seed=s, sim=sim, budget_usd=30.0, setup_grace_s=1.0) for s in range(50)]
    jobs = [j.__class__(**{**{f: getattr(j, f) for f in j.__struct_fields__}, "timeout_s": 2.0}) for j in jobs]
    with open_runner(concurrency=20, budget_usd=30.0, meter_period_s=0.05) as r:
        ended = [r.submit(j) for j in jobs]
        results = [h.result(120) for h in ended]
        money = r.budget_statistics()
    outcomes = {(e.outcome, e.failure) for e in results}
    assert outcomes <= {("succeeded", None), ("failed", Code.BUDGET)}
    assert ("failed", Code.BUDGET) in outcomes  # seeds 11 to 20 found the money held by the first ten
    assert ("succeeded", None) in outcomes
    reader = LedgerReader(state_dir / "ledger.sqlite")
    try:
        rows = reader.reservations()
        machines = reader.machines()
    finally:
        reader.close()
    totals = replay(rows)
    assert max(totals) <= 30 * MICRO
    assert max(totals) > 27 * MICRO  # the budget was really full at some moment: the check bit
    assert all(r["state"] == "released" for r in rows)
    # a job that ended `budget` before any lease rented nothing: no machine row, no reservation
    unrented = {f"many/seed-{e.seed}" for e in results if e.failure is Code.BUDGET and e.attempts == 0}
    assert unrented
    assert not {f"{m.job}/seed-{m.seed}" for m in machines} & unrented
    assert not {r["job"] for r in rows} & unrented
    # the money agrees: the events, the Runner's figures, the ledger, and the sim's own bill
    assert money.reserved_usd == 0
    assert abs(money.spent_usd - sum(r["charged"] for r in rows)) < 1e-4
    assert abs(money.spent_usd - sum(b.usd for b in billing(sim_dir))) < 0.05
    reserved_events, charged_events = events.of(Reserved), events.of(Charged)
    assert len(reserved_events) == len(rows) == len(charged_events)
    assert all(e.spent_usd + e.reserved_usd <= 30.0 + 1e-9 for e in reserved_events + charged_events)
    assert sim_machines(sim_dir) == []


def test_an_attempt_outrunning_its_estimate_ends_before_its_reservation_is_spent(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, sim_dir: Path, state_dir: Path,
) -> None:
    # $1 a second; timeout_s 1 + grace 2: $3 reserved. The job runs 60 s and the heartbeat polls
    # every 30 s: its timeout_s is a timer (issue 48), which ends it at 1 s, before the $3 are spent
    # (the meter's guard at the reservation is the backstop behind it)
    sim = {"regions": regions(("r", "A100", 4, 3600.0)), "virtual": True, "virtual_job_s": 60.0}
    job = sim_job("long", "train", sim=sim, budget_usd=10.0, setup_grace_s=2.0, poll_s=30.0, stall_after_s=600.0,
                  lost_after_s=600.0)
    job = job.__class__(**{**{f: getattr(job, f) for f in job.__struct_fields__}, "timeout_s": 1.0})
    with open_runner(concurrency=1, budget_usd=10.0, meter_period_s=0.1) as r:
        ended = r.submit(job).result(60)
        money = r.budget_statistics()
    assert (ended.outcome, ended.failure) == ("failed", Code.JOB_FAILED)
    assert "timeout_s" in ended.detail
    assert ended.attempts == 1  # final: no retry
    (reserved,), (charged,) = events.of(Reserved), events.of(Charged)
    assert reserved.usd == 3.0
    assert charged.reserved == 3.0
    assert 0.0 < charged.usd <= 3.0  # it was gone before its $3 were spent
    assert money.spent_usd == charged.usd  # the event says what the budget spent: whole micro-dollars, rounded up
    assert money.spent_usd <= 10.0
    assert sim_machines(sim_dir) == []
    (bill,) = billing(sim_dir)
    assert bill.usd <= 3.0
    assert abs(bill.usd - charged.usd) < 0.05


def test_the_seeds_max_usd_bounds_its_attempts(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, sim_dir: Path,
) -> None:
    sim = {"regions": regions(("r", "A100", 4, 3600.0)), "virtual": True, "virtual_job_s": 0.2}
    job = sim_job("capped", "train", sim=sim, setup_grace_s=1.0)
    job = job.__class__(**{**{f: getattr(job, f) for f in job.__struct_fields__}, "timeout_s": 2.0,
                           "max_usd": 2.5})
    with open_runner(concurrency=1, meter_period_s=0.1) as r:
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.failure) == ("failed", Code.BUDGET)
    assert "max_usd" in ended.detail
    assert ended.attempts == 0
    assert billing(sim_dir) == []


def test_an_older_ledger_gains_the_reservations_table(tmp_path: Path) -> None:
    import sqlite3

    from actor_run.supervisors.ledger.schema import version_of

    path = tmp_path / "ledger.sqlite"
    old = sqlite3.connect(path)
    old.executescript((Path(__file__).parent.parent / "supervisors" / "data" / "ledger_schema_2e5f0be.sql").read_text())
    old.close()
    reader = LedgerReader(path)
    try:
        with reader.backend.reading() as conn:
            assert version_of(conn) >= 3
            columns = {row[1] for row in conn.execute("PRAGMA table_info(reservations)")}
        assert reader.reservations() == []
        assert {"run", "job", "attempt", "account", "usd", "charged", "seq", "released_seq"} <= columns
    finally:
        reader.close()
