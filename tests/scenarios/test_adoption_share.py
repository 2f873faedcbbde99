"""A dead worker's jobs on a shared ledger while every live worker is full: each adopter takes its
share of those that need a machine at its first poll (they wait in its batch for a slot), instead
of leaving them under the dead owner until slots free (bench/scaleout.py: 3,000 jobs waited about
84 s past the lease for the other workers' jobs to end). Each job is adopted once and run once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger import Ledger, LedgerReader
from actor_run.supervisors.ledger.db import close_pools


@pytest.fixture
def url(postgres: Any) -> Iterator[str]:
    yield postgres.create_database()
    close_pools()


def test_full_workers_adopt_their_shares_of_a_dead_workers_jobs_at_once_and_each_runs_once(
        tmp_path: Path, url: str, local_job: Any) -> None:
    jobs = [local_job("orphan", "echo ran >> $ACTOR_RUN_OUT/runs.txt", seed=seed) for seed in range(1, 6)]
    common: dict[str, Any] = {"out_dir": tmp_path / "out", "ledger": url, "sweep_on_start": False,
                              "concurrency": 1, "lease_s": 30.0}
    with Runner(state_dir=tmp_path / "submitter", **common) as submitter:
        for job in jobs:
            submitter.enqueue(job)
        submitter.ledger.flush()
        run = submitter.run
    dead = Ledger(url, "d" * 32, lease_s=30.0)
    try:
        dead.register_owner()
        assert len(dead.claim_queued(5)) == 5  # claimed, then the worker died before any machine was asked for
        dead.close_owner()
    finally:
        dead.close()
    with Runner(state_dir=tmp_path / "a", **common) as a, Runner(state_dir=tmp_path / "b", **common) as b:
        # both full (no free slot): each still adopts its share of the five, ceil(5 / 2) = 3 ...
        first = a.resume(sweep_after=False, take_runs=False, most_new=0)
        assert len(first) == 3, [h.key for h in first]
        # ... and the other worker what is left, its share of them, over its next polls
        second = b.resume(sweep_after=False, take_runs=False, most_new=0)
        assert len(second) == 1, [h.key for h in second]
        third = b.resume(sweep_after=False, take_runs=False, most_new=0)
        assert len(third) == 1, [h.key for h in third]
        assert a.resume(sweep_after=False, take_runs=False, most_new=0) == []
        handles = first + second + third
        assert sorted(h.key for h in handles) == sorted(j.key for j in jobs)  # each adopted once
        ended = [h.result(120) for h in handles]
    assert [e.outcome for e in ended] == ["succeeded"] * 5
    reader = LedgerReader(url)
    try:
        owners = {j["key"]: j["owner"] for j in reader.jobs()}
        assert {j["state"] for j in reader.jobs()} == {"succeeded"}
    finally:
        reader.close()
    assert {owners[h.key] for h in first} == {a.owner}
    assert {owners[h.key] for h in second + third} == {b.owner}
    for job in jobs:  # run once each
        assert (tmp_path / "out" / run / "orphan" / f"seed-{job.seed}" / "out" / "runs.txt").read_text() == "ran\n"
