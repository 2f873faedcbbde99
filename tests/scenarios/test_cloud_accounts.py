"""Accounts of one cloud ([clouds.sim.accounts.<name>]): a candidate walks its accounts in order,
and a refusal saying an account is out of quota moves the walk to the same place on the next."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actor_run.protocols.clouds.sim import billing, sim_machines
from actor_run.protocols.failures import Code, SpecError
from actor_run.protocols.messages import AttemptStarted, LeaseFailed, Reserved
from actor_run.protocols.specs import CandidateSpec
from actor_run.supervisors.cli.cost import cost_rows
from actor_run.supervisors.ledger import LedgerReader


def two_accounts(regions: Any) -> dict[str, Any]:
    # main is out of quota; team-b, the same provider with its own key, is not
    return {
        "regions": regions(("cheap", "A100", 4, 360.0), ("dear", "A100", 4, 720.0)), "virtual": True,
        "virtual_job_s": 0.2, "quota_exceeded": True,
        "accounts": {"team-b": {"api_key_env": "SIM_TEAM_B_KEY", "quota_exceeded": False}},
    }


def test_quota_on_the_first_account_moves_to_the_same_place_on_the_next(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, sim_dir: Path, state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIM_TEAM_B_KEY", "not-a-real-key")
    job = sim_job("acct", "train", sim=two_accounts(regions),
                  candidates=[CandidateSpec(cloud="sim", gpu="A100", accounts=["main", "team-b"])])
    with open_runner(concurrency=1, budget_usd=1000.0) as r:
        ended = r.submit(job).result(60)
        assert {"sim", "sim@team-b"} <= set(r.clouds)  # every account is a cloud the sweep lists
        swept = r.sweep(dry_run=True)
    assert (ended.outcome, ended.attempts) == ("succeeded", 1)  # the quota refusal made no machine: no attempt
    (refused,) = events.of(LeaseFailed)
    assert refused.failure is Code.QUOTA
    places = [(e.offer.account, e.offer.region) for e in events.of(AttemptStarted)]
    assert places == [("main", "cheap"), ("team-b", "cheap")]  # the same place, the next account
    assert [e.offer.account for e in events.of(Reserved)] == ["main", "team-b"]
    assert not [a for a in swept if a.action == "failed"]  # both accounts listed
    (bill,) = billing(sim_dir)
    assert bill.account == "team-b"
    assert sim_machines(sim_dir) == []
    reader = LedgerReader(state_dir / "ledger.sqlite")
    try:
        refused_row, machine = reader.machines()
        rows = reader.reservations()
    finally:
        reader.close()
    assert (refused_row.cloud, refused_row.machine, refused_row.state) == ("sim", None, "deleted")  # never made
    assert (machine.cloud, machine.state) == ("sim@team-b", "deleted")
    assert [(r["account"], r["state"], r["charged"] > 0) for r in rows] == [("main", "released", False),
                                                                           ("team-b", "released", True)]
    # the cost report splits the spend by account, and team-b's is what the provider billed it
    groups, total, _ = cost_rows(rows, [refused_row, machine], by="account")
    assert [(g.group, g.attempts) for g in groups] == [("sim/main", 0), ("sim/team-b", 1)]  # the refusal: no attempt
    assert groups[0].spent_usd == 0
    assert abs(groups[1].spent_usd - bill.usd) < 0.005
    assert total.spent_usd == groups[1].spent_usd


def test_quota_on_the_last_account_walks_to_the_next_candidate(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SIM_TEAM_B_KEY", "k")
    sim = two_accounts(regions)
    sim["accounts"]["team-b"]["quota_exceeded"] = True
    job = sim_job("acct", "true", sim=sim, candidates=[
        CandidateSpec(cloud="sim", gpu="A100", accounts=["main", "team-b"]), CandidateSpec(cloud="local")])
    with open_runner(concurrency=1) as r:
        ended = r.submit(job).result(60)
    assert ended.outcome == "succeeded"
    assert [(e.offer.cloud, e.offer.account) for e in events.of(AttemptStarted)] == [
        ("sim", "main"), ("sim", "team-b"), ("local", "")]


def test_an_unknown_account_or_a_missing_key_is_refused_before_anything_starts(
    open_runner: Callable[..., Any], sim_job: Any, regions: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SIM_TEAM_B_KEY", raising=False)
    job = sim_job("acct", "true", sim=two_accounts(regions),
                  candidates=[CandidateSpec(cloud="sim", accounts=["main", "team-c"])])
    with open_runner() as r:
        with pytest.raises(SpecError, match=r"candidates\[0\].accounts: sim has no account 'team-c'"):
            r.submit(job)
        ok = msgspec.structs.replace(job, candidates=[CandidateSpec(cloud="sim", accounts=["team-b"])])
        with pytest.raises(SpecError, match=r"clouds\.sim\.accounts\.team-b\.api_key_env: set the environment"):
            r.submit(ok)
