"""supervisors/api/runner.py: the embedding API. Runner, BatchSupervisor and JobHandle with real
clouds: outputs, the ledger, close() with jobs running, the batch budget, concurrency."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka
import pytest

from actor_run.actors.flag import Flag
from actor_run.actors.pool import PooledActor
from actor_run.protocols.clouds.sim import sim_machines
from actor_run.protocols.failures import ActorRunError, Code, RunnerClosed, SpecError
from actor_run.protocols.messages import (
    AttemptStarted,
    JobEnded,
    JobStarted,
    Leased,
    LeaseRequested,
    Progress,
    Released,
    Reserved,
)
from actor_run.protocols.specs import CandidateSpec, Job, PolicySpec
from actor_run.supervisors.api.handle import JobHandle
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger import LedgerError, LedgerReader

WRITE_OUT = (
    'sh -c \'echo hello from $ACTOR_RUN_SEED; echo {\\"stage\\": \\"train\\"} >> $ACTOR_RUN_PROGRESS; '
    "echo $ACTOR_RUN_SEED > $ACTOR_RUN_OUT/result.txt'"
)


def test_outputs_land_in_the_seed_folder(
    open_runner: Callable[..., Any],
    sim_job: Any,
    local_job: Any,
    tmp_path: Path,
    state_dir: Path,
    sim_dir: Path,
) -> None:
    jobs = [
        local_job("loc", WRITE_OUT, seed=7),
        sim_job(
            "sim",
            WRITE_OUT,
            seed=-2,
            sim={"regions": [{"name": "r", "gpus": {"A100": {"stock": 1, "hourly_usd": 36.0}}}]},
        ),
    ]
    with open_runner() as r:
        handles = [r.submit(j) for j in jobs]
        ended = [h.result(60) for h in handles]
        run = r.run
    assert [e.outcome for e in ended] == ["succeeded", "succeeded"]
    assert (tmp_path / "out" / "latest").resolve() == tmp_path / "out" / run
    for job, e in zip(jobs, ended, strict=True):
        seed_dir = tmp_path / "out" / run / job.name / f"seed-{job.seed}"  # each run its own folder
        assert e.out_dir == str(seed_dir)
        assert {p.name for p in seed_dir.iterdir()} == {"log.txt", "out", "response.json", "progress.jsonl"}
        assert json.loads((seed_dir / "progress.jsonl").read_text()) == {"stage": "train"}
        assert (seed_dir / "out" / "result.txt").read_text() == f"{job.seed}\n"
        assert f"hello from {job.seed}" in (seed_dir / "log.txt").read_text()
        body = json.loads((seed_dir / "response.json").read_text())
        assert (body["job"], body["seed"], body["outcome"], body["failure"], body["exit_code"]) == (
            job.name,
            job.seed,
            "succeeded",
            None,
            0,
        )
        assert len(body["attempts"]) == 1
        assert {"lease", "upload", "start", "run", "fetch", "release"} <= set(body["phases"])
        assert all(v >= 0 for v in body["phases"].values())
        assert body["usd"] == pytest.approx(sum(a["usd"] for a in body["attempts"]), abs=1e-6)  # rounded to 6 places
    loc, sim = (json.loads((tmp_path / "out" / "latest" / j.name / f"seed-{j.seed}" / "response.json").read_text())
        for j in jobs)
    assert loc["usd"] == 0.0  # this computer costs nothing
    assert sim["usd"] > 0.0  # $36/h for the seconds it was held
    assert ended[1].usd == pytest.approx(sim["usd"], abs=1e-6)
    # after close every machine the ledger heard of is deleted, at the provider too
    rows = LedgerReader(state_dir / "ledger.sqlite")
    try:
        machines = rows.machines()
        assert sorted(m.cloud for m in machines) == ["local", "sim"]
        assert {m.state for m in machines} == {"deleted"}
        assert {m.reason for m in machines} == {"deleted"}
        assert all(m.gone for m in machines)
        jobs_rows = {j["key"]: j for j in rows.jobs()}
        assert {k: v["state"] for k, v in jobs_rows.items()} == {
            "loc/seed-7": "succeeded",
            "sim/seed--2": "succeeded",
        }
        types = [e["type"] for e in rows.events("loc/seed-7")]
        assert types[0] == "AttemptStarted"
        assert types[-1] == "JobEnded"
    finally:
        rows.close()
    assert sim_machines(sim_dir) == []


def test_a_second_run_replaces_what_the_first_fetched(
    open_runner: Callable[..., Any], local_job: Any, tmp_path: Path
) -> None:
    """The seed's out/ and progress.jsonl are the last fetch's, whole: a rerun over the same out_dir
    leaves nothing of the first run's outputs (a job that made its seed folder skips that check)."""
    first = "sh -c 'echo {\\\"stage\\\": \\\"one\\\"} >> $ACTOR_RUN_PROGRESS; echo 1 > $ACTOR_RUN_OUT/first.txt'"
    second = "sh -c 'echo 2 > $ACTOR_RUN_OUT/second.txt'"
    seed_dir = tmp_path / "out" / "latest" / "again" / "seed-1"
    with open_runner() as r:
        assert r.submit(local_job("again", first)).result(60).outcome == "succeeded"
        first_run = r.run
    assert (seed_dir / "out" / "first.txt").read_text() == "1\n"
    assert (seed_dir / "progress.jsonl").exists()
    with open_runner() as r:
        assert r.submit(local_job("again", second)).result(60).outcome == "succeeded"
    assert sorted(p.name for p in (seed_dir / "out").iterdir()) == ["second.txt"]
    # the first run's results are its own, untouched: <out>/<run>/ (issue 29.7)
    kept = tmp_path / "out" / first_run / "again" / "seed-1"
    assert (kept / "out" / "first.txt").read_text() == "1\n"
    assert json.loads((kept / "response.json").read_text())["outcome"] == "succeeded"
    assert not (seed_dir / "progress.jsonl").exists() or "one" not in (seed_dir / "progress.jsonl").read_text()


def test_wait_returns_every_end_in_submit_order_or_times_out(
    open_runner: Callable[..., Any], local_job: Any
) -> None:
    with open_runner() as r:
        quick = [r.submit(local_job("quick", "true", seed=s)) for s in (3, 1, 2)]
        assert [e.seed for e in r.wait(timeout=60)] == [3, 1, 2]
        assert all(h.done() for h in quick)
        r.submit(local_job("slow", "sleep 60"))
        with pytest.raises(TimeoutError, match="1 of 4 jobs still running"):
            r.wait(timeout=0.5)


def test_close_with_a_running_job_cancels_it_and_deletes_every_machine(
    open_runner: Callable[..., Any],
    events: Any,
    sim_job: Any,
    local_job: Any,
    ledger_machines: Any,
    sim_dir: Path,
) -> None:
    with open_runner(concurrency=3) as r:
        handles = [r.submit(sim_job("long", "sleep 40.917", seed=s)) for s in (1, 2)]
        handles.append(r.submit(local_job("long", "sleep 40.917", seed=3)))
        for s in (1, 2, 3):
            events.wait_for(lambda e, s=s: isinstance(e, JobStarted) and e.seed == s)
        assert len(sim_machines(sim_dir)) == 2
        assert {m.state for m in ledger_machines()} == {"alive"}
    # close() returned: every job ended canceled, every machine is gone
    for h in handles:
        assert h.done()
        ended = h.result(0)
        assert (ended.outcome, ended.failure) == ("failed", Code.CANCELED)
    assert sim_machines(sim_dir) == []
    rows = ledger_machines()
    assert len(rows) == 3
    assert {m.state for m in rows} == {"deleted"}
    assert sorted(e.confirmed for e in events.of(Released)) == [True, True, True]


def test_a_budget_that_cannot_hold_one_attempt_rents_nothing(
    open_runner: Callable[..., Any],
    events: Any,
    sim_job: Any,
    policy: Any,
    regions: Any,
    sim_dir: Path,
    ledger_machines: Any,
) -> None:
    # $3600 an hour is $1 a second: an hour's timeout needs far more than $0.05 reserved
    sim = {"regions": regions(("r", "A100", 8, 3600.0))}
    jobs = [sim_job("costly", "sleep 41.917", seed=s, sim=sim, budget_usd=0.05) for s in (1, 2, 3)]
    with open_runner(concurrency=2, budget_usd=0.05, meter_period_s=0.05) as r:
        handles = [r.submit(j) for j in jobs]
        ended = [h.result(60) for h in handles]
        spent = r.spent_usd()
        money = r.budget_statistics()
    assert [(e.outcome, e.failure) for e in ended] == [("failed", Code.BUDGET)] * 3
    assert "budget" in ended[0].detail
    assert "needs $" in ended[0].detail
    assert [e.attempts for e in ended] == [0, 0, 0]
    assert not events.of(AttemptStarted)
    assert spent == 0
    assert (money.spent_usd, money.reserved_usd, money.refused) == (0, 0, 6)  # each seed's walk asked twice
    assert sim_machines(sim_dir) == []
    assert ledger_machines() == []


def test_concurrency_one_runs_jobs_one_after_another(
    open_runner: Callable[..., Any], events: Any, local_job: Any
) -> None:
    with open_runner(concurrency=1) as r:
        handles = [r.submit(local_job("one", "true", seed=s)) for s in (1, 2, 3)]
        ended = r.wait(60)
    assert [h.result(0) for h in handles] == ended
    assert [e.outcome for e in ended] == ["succeeded"] * 3
    order = [(type(e).__name__, e.seed) for e in events.drain() if isinstance(e, AttemptStarted | JobEnded)]
    assert order == [
        ("AttemptStarted", 1),
        ("JobEnded", 1),
        ("AttemptStarted", 2),
        ("JobEnded", 2),
        ("AttemptStarted", 3),
        ("JobEnded", 3),
    ]


def test_a_bad_job_is_refused_before_anything_starts(
    open_runner: Callable[..., Any], local_job: Any, tmp_path: Path, ledger_machines: Any
) -> None:
    with open_runner() as r:
        with pytest.raises(SpecError, match=r"^job\.name: "):
            r.submit(local_job("Bad Name", "true"))
        with pytest.raises(SpecError, match=r"^candidates\[0\]\.cloud: unknown cloud 'nimbus'"):
            r.submit(Job(name="x", command="true", seed=1, candidates=[CandidateSpec(cloud="nimbus")]))
        with pytest.raises(SpecError, match=r"^clouds\.nimbus: unknown cloud"):  # a Batch.load leaves it to here
            r.submit(Job(name="x", command="true", seed=1, candidates=[CandidateSpec(cloud="local")],
                         clouds={"nimbus": {}}))
        with pytest.raises(SpecError, match=r"^clouds\.sim\.no_capacity_rate: expected number between 0 and 1"):
            r.submit(
                Job(
                    name="x",
                    command="true",
                    seed=1,
                    candidates=[CandidateSpec(cloud="sim")],
                    clouds={"sim": {"no_capacity_rate": 2.0}},
                )
            )
        with pytest.raises(SpecError, match=r"^job\.code: no such folder"):
            r.submit(Job(name="x", command="true", seed=1, code=str(tmp_path / "nowhere")))
        assert r.handles == {}
    assert ledger_machines() == []


def test_the_seeds_of_a_batch_are_checked_again_when_what_they_share_changes(
    open_runner: Callable[..., Any],
) -> None:
    """The check remembers the policy, places and cloud settings of the last job that passed (a
    batch's seeds share them: item 57 of bench/RESULTS.md); a job whose settings differ, even a table
    changed in place since, or whose places or policy differ, is checked whole."""
    clouds: dict[str, Any] = {"sim": {"no_capacity_rate": 0.5}}
    sim = [CandidateSpec(cloud="sim")]
    with open_runner() as r:
        for seed in range(3):
            r.check(Job(name="x", command="true", seed=seed, candidates=sim, clouds=clouds))
        clouds["sim"]["no_capacity_rate"] = 2.0  # the same dict, changed in place
        with pytest.raises(SpecError, match=r"^clouds\.sim: "):  # not the settings its sim was built with
            r.check(Job(name="x", command="true", seed=3, candidates=sim, clouds=clouds))
        clouds["sim"]["no_capacity_rate"] = 0.5
        r.check(Job(name="x", command="true", seed=4, candidates=sim, clouds=clouds))
        with pytest.raises(SpecError, match=r"^candidates\[0\]\.gpu: "):
            r.check(Job(name="x", command="true", seed=5, candidates=[CandidateSpec(cloud="sim", gpu="Z999")],
                        clouds=clouds))
        with pytest.raises(SpecError, match=r"^policy\.poll_s: "):
            r.check(Job(name="x", command="true", seed=6, candidates=sim, clouds=clouds,
                        policy=PolicySpec(poll_s=-1.0)))
        with pytest.raises(SpecError, match=r"^job\.name: "):  # the job's own fields, every time
            r.check(Job(name="Bad Name", command="true", seed=7, candidates=sim, clouds=clouds))


def test_a_job_key_runs_once_at_a_time(open_runner: Callable[..., Any], events: Any, local_job: Any) -> None:
    with open_runner() as r:
        first = r.submit(local_job("dup", "sleep 42.917"))
        with pytest.raises(SpecError, match="already running"):
            r.submit(local_job("dup", "true"))
        events.wait_for(lambda e: isinstance(e, Leased))
        first.cancel()
        assert first.result(60).failure is Code.CANCELED
        again = r.submit(local_job("dup", "true"))  # once it ended, the key is free
        assert again.result(60).outcome == "succeeded"


def test_a_runner_must_be_open(tmp_path: Path, state_dir: Path) -> None:
    runner = Runner(out_dir=tmp_path / "out", state_dir=state_dir)
    with pytest.raises(RunnerClosed, match="not open"):  # an ActorRunError: the caller's mistake, named
        runner.submit(Job(name="x", command="true", seed=1))
    runner.close()  # closing a runner never opened is a no-op
    with Runner(out_dir=tmp_path / "out", state_dir=state_dir, sweep_on_start=False) as closed:
        pass
    for call in (lambda: closed.submit(Job(name="x", command="true", seed=1)), closed.cancel,
                 lambda: closed.resume()):
        with pytest.raises(RunnerClosed, match="not open"):
            call()
    assert issubclass(RunnerClosed, ActorRunError)
    with pytest.raises(SpecError, match=r"^concurrency: expected int >= 1, got 0"):
        Runner(out_dir=tmp_path / "out", state_dir=state_dir, concurrency=0).open()


def test_a_quick_job_is_not_held_up(open_runner: Callable[..., Any], local_job: Any, sim_job: Any) -> None:
    # `true` ends in a tenth of a second; a lost wake-up of an actor (a turn queued on the pool that
    # no worker takes until an idle timeout) showed up as a job that took 10 s to say it had ended
    with open_runner() as r:
        for job in (local_job("quick", "true"), sim_job("quick-sim", "true")):
            ended = r.submit(job).result(timeout=5)
            assert ended.outcome == "succeeded"


def test_a_runner_that_cannot_open_leaves_nothing_running(tmp_path: Path) -> None:
    import threading

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the ledger's folder should be")
    before = {t.ident for t in threading.enumerate()}
    with (pytest.raises(LedgerError, match="not-a-folder"),  # one line naming it (issue 23), not an OSError
          Runner(ledger=blocker / "ledger.sqlite", state_dir=tmp_path / "state")):
        pass
    # the autouse leak check also fails the test if a reactor or ledger thread outlives it
    assert [t.name for t in threading.enumerate() if t.ident not in before and t.name.startswith("actor-run-")] == []


def test_an_open_runner_keeps_nothing_per_attempt_once_its_jobs_ended(
        open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any) -> None:
    # an embedding orchestrator keeps one Runner open for days: the stage each attempt last reported
    # (kept so that only a new stage goes to the ledger) goes when the attempt ends
    sim = {"regions": regions(("r", "A100", 4, 1.0)), "virtual": True, "virtual_job_s": 1.5}
    with open_runner() as r:
        handles = [r.submit(sim_job("kept", "train", seed=s, sim=sim, poll_s=0.1)) for s in range(4)]
        assert [h.result(timeout=60).outcome for h in handles] == ["succeeded"] * 4
        progressed = {e.seed for e in events.drain() if isinstance(e, Progress) and e.stage}
        assert progressed == {0, 1, 2, 3}  # each attempt did report a stage
        assert r._bus is not None
        assert r._bus.held() == 0


class Submitter(PooledActor):
    """Submits every job in one turn: they are all in the batch's inbox before its first turn."""

    def __init__(self, runner: Runner, jobs: list[Job], handles: list[JobHandle], done: Flag) -> None:
        super().__init__()
        self.runner, self.jobs, self.handles, self.done = runner, jobs, handles, done

    def on_receive(self, message: Any) -> Any:
        self.handles.extend(self.runner.submit(job) for job in self.jobs)
        self.done.set()
        return None


def test_the_first_jobs_of_a_large_batch_go_on_while_the_batch_starts_the_rest(
        open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any) -> None:
    # a batch's turn starts at most as many jobs as run already (16, 16, 32 ... 1,024): with 300 jobs
    # told at once, the first job asks for its machine before the last one is started. In one turn of
    # 1,024 every step of the first job waited behind all 300 starts (bench/RESULTS.md, item 74)
    sim = {"regions": regions(("r", "A100", 400, 1.0)), "virtual": True, "virtual_job_s": 0.2}
    jobs = [sim_job("many", "train", seed=s, sim=sim, poll_s=0.1) for s in range(300)]
    handles: list[JobHandle] = []
    done = Flag()
    with open_runner(concurrency=300) as r:
        # the run recorded and the sim made (the first job's check) here: `submit` in the submitter's
        # turn then only queues, with nothing that could wait and let another pool worker start the batch
        r.start_run()
        r.check(jobs[0])
        submitter: pykka.ActorRef[Any] = Submitter.start(r, jobs, handles, done)
        try:
            submitter.tell("go")
            assert done.wait(30)
            assert [h.result(timeout=120).outcome for h in handles] == ["succeeded"] * 300
        finally:
            submitter.stop()
    # a job's first event (`Reserved`) is its supervisor's first turn
    order = [(type(e).__name__, e.seed) for e in events.drain() if isinstance(e, Reserved | LeaseRequested)]
    assert len(order) == 600
    assert order.index(("LeaseRequested", 0)) < order.index(("Reserved", 299))
