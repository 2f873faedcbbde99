"""`Runner.hand_back` on a shared ledger (a worker's SIGTERM), in-process: every job held is let go,
each of its machines announced `Released` (not deleted, "left to the controller that took over its
job") before `close()` returns, and another Runner on the ledger adopts the jobs and finishes them,
giving a job that names no team budget its own settings' one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actor_run.protocols.messages import JobStarted, Released
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger.db import close_pools


@pytest.fixture
def url(postgres: Any) -> Iterator[str]:
    yield postgres.create_database()
    close_pools()


def test_a_hand_back_lets_every_machine_go_before_close_returns_and_another_runner_finishes_them(
        tmp_path: Path, url: str, events: Any, local_job: Any) -> None:
    jobs = [local_job("hb", "sleep 4; echo done > $ACTOR_RUN_OUT/done.txt", seed=seed) for seed in (1, 2)]
    common: dict[str, Any] = {"out_dir": tmp_path / "out", "ledger": url, "state_dir": tmp_path / "state",
                              "concurrency": 2, "lease_s": 30.0, "sweep_on_start": False}
    with Runner(**common) as leaving:
        leaving.subscribe(events)
        for job in jobs:
            leaving.enqueue(job)
        leaving.ledger.flush()
        assert len(leaving.claim(2)) == 2
        for seed in (1, 2):
            events.wait_for(lambda e, s=seed: isinstance(e, JobStarted) and e.seed == s)
        assert leaving.hand_back() == {job.key for job in jobs}
    # close() has returned: each lease has said what it did with its machine
    let_go = [e for e in events.drain() if isinstance(e, Released)]
    assert sorted(e.seed for e in let_go) == [1, 2], let_go
    assert all(not e.confirmed and "left to the controller that took over its job" in e.detail for e in let_go)
    with Runner(**common) as adopter:
        handles = adopter.resume(sweep_after=False, take_runs=False, most_new=2)
        assert sorted(h.key for h in handles) == sorted(job.key for job in jobs)
        ended = [h.result(120) for h in handles]
    assert [e.outcome for e in ended] == ["succeeded", "succeeded"]
    for seed in (1, 2):  # run once: the adopter watched the same job to its end, nothing started again
        assert list((tmp_path / "out").glob(f"*/hb/seed-{seed}/out/done.txt")) != []


def test_an_adopter_gives_its_settings_budget_to_an_adopted_job_that_names_none(
        tmp_path: Path, url: str, events: Any, local_job: Any) -> None:
    """A job queued and claimed with no team budget anywhere (batch, submitter, first worker), then
    handed back: the Runner that adopts it has `budget = "team-w"` in its settings, and the job it
    runs draws on that, as a job it claimed would."""
    gate = tmp_path / "gate"
    job = local_job("hbb", f"while [ ! -e {gate} ]; do sleep 0.05; done")
    common: dict[str, Any] = {"out_dir": tmp_path / "out", "ledger": url, "state_dir": tmp_path / "state",
                              "concurrency": 1, "lease_s": 30.0, "sweep_on_start": False}
    (tmp_path / "none.toml").write_text("")
    (tmp_path / "team-w.toml").write_text('budget = "team-w"\n')
    try:
        with Runner(**common, config=tmp_path / "none.toml") as leaving:
            leaving.subscribe(events)
            leaving.enqueue(job)
            leaving.ledger.flush()
            (claimed,) = leaving.claim(1)
            assert claimed.job.policy.budget is None
            events.wait_for(lambda e: isinstance(e, JobStarted))
            assert leaving.hand_back() == {job.key}
        with Runner(**common, config=tmp_path / "team-w.toml") as adopter:
            (handle,) = adopter.resume(sweep_after=False, take_runs=False, most_new=1)
            assert handle.job.policy.budget == "team-w"
            gate.touch()
            assert handle.result(120).outcome == "succeeded"
    finally:
        gate.touch()
