"""supervisors/tree/batch.py: what a BatchSupervisor keeps of its jobs. A worker's batch runs for
days: every table it keeps per job (running, the jobs let go, the labels its children's failures
name) forgets a job once its end is handled, whether the job ended here or was let go to another
controller. Real parts: two Runners on a real PostgreSQL ledger (tests/support/pg.py), the local cloud."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.waits import settled

from actor_run.protocols.messages import JobStarted
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger.db import close_pools

SEEDS = range(1, 13)


@pytest.fixture
def url(postgres: Any) -> Iterator[str]:
    yield postgres.create_database()
    close_pools()


def kept(runner: Runner) -> dict[str, int]:
    """How many jobs each of the batch's per-job tables holds (read on the batch's own thread)."""
    batch = runner.board._batch.proxy()
    return {"running": len(batch.running.get()), "leaving": len(batch.leaving.get()),
            "labels": len(batch.labels.get())}


def left_in(runner: Runner) -> dict[str, int]:
    """The tables that still hold a job, once they hold none (or after a bound: what they hold)."""
    return settled(lambda: {k: n for k, n in kept(runner).items() if n}, 60)


def test_a_batch_of_many_seeds_keeps_nothing_of_its_jobs_once_they_ended_or_were_let_go(
        tmp_path: Path, url: str, events: Any, local_job: Any) -> None:
    """Twelve seeds claimed, then handed back (their jobs let go: `Abandon`): once each job's stop
    hook has run the batch holds none of them. Another Runner adopts the twelve and runs them to
    their end: its batch holds none of them either."""
    gate = tmp_path / "gate"
    jobs = [local_job("many", f"while [ ! -e {gate} ]; do sleep 0.05; done", seed=seed) for seed in SEEDS]
    common: dict[str, Any] = {"out_dir": tmp_path / "out", "ledger": url, "state_dir": tmp_path / "state",
                              "concurrency": len(jobs), "lease_s": 30.0, "sweep_on_start": False}
    try:
        with Runner(**common) as leaving:
            leaving.subscribe(events)
            for job in jobs:
                leaving.enqueue(job)
            leaving.ledger.flush()
            assert len(leaving.claim(len(jobs))) == len(jobs)
            for seed in SEEDS:
                events.wait_for(lambda e, s=seed: isinstance(e, JobStarted) and e.seed == s, timeout=120)
            assert kept(leaving) == {"running": len(jobs), "leaving": 0, "labels": len(jobs)}
            assert leaving.hand_back() == {job.key for job in jobs}
            after_hand_back = left_in(leaving)  # asserted once the adopter has ended the jobs
        with Runner(**common) as adopter:
            handles = adopter.resume(sweep_after=False, take_runs=False, most_new=len(jobs))
            assert sorted(h.key for h in handles) == sorted(job.key for job in jobs)
            gate.touch()
            ended = [h.result(120) for h in handles]
            assert [e.outcome for e in ended] == ["succeeded"] * len(jobs)
            assert left_in(adopter) == {}
    finally:
        gate.touch()
    assert after_hand_back == {}
