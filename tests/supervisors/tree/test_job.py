"""supervisors/tree/job.py: one job's attempts through a real Runner, on the `sim` and `local` clouds:
the capacity walk, what is retried (on a fresh machine) and what is not, response.json."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from support.process_kit import sleeping
from support.waits import poll

from actor_run.protocols.clouds.sim import billing, preempt_machine, sim_machines
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    JobEnded,
    JobStarted,
    Leased,
    LeaseFailed,
    Machine,
    Released,
    Retrying,
    Stalled,
    Uploaded,
    WaitingForCapacity,
)
from actor_run.protocols.specs import CandidateSpec
from actor_run.supervisors.tree.seed_end import tidy_seed_dir

# a job that is silent on its first attempt (a stall) and succeeds on the next ones
# (the later ones report a stage past setup at once, so a slow machine does not make them stall too)
QUIET_FIRST = (
    'sh -c \'if [ "$ACTOR_RUN_ATTEMPT" = 0 ]; then sleep {s}; '
    'else echo {{\\"stage\\": \\"train\\"}} >> $ACTOR_RUN_PROGRESS; echo ok-$ACTOR_RUN_ATTEMPT; fi\''
)


def wait_until(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    """Poll an outside condition (a process list), bounded."""
    return poll(check, timeout, "the condition", every=0.02)


def response(tmp_path: Path, job: str, seed: int = 1) -> dict[str, Any]:
    path = tmp_path / "out" / "latest" / job / f"seed-{seed}" / "response.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_the_walk_moves_past_places_without_stock(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, tmp_path: Path, sim_dir: Path
) -> None:
    sim = {"regions": regions(("us-east", "H100", 0, 2.9), ("eu-west", "H100", 5, 2.9), ("us-east", "A100", 5, 1.8))}
    candidates = [
        CandidateSpec(cloud="sim", gpu="H100", regions=["us-east"]),  # no stock there
        CandidateSpec(cloud="sim", gpu="H100", max_hourly_usd=1.0),  # stock, but above the ceiling
        CandidateSpec(cloud="sim", gpu="A100"),
    ]
    job = sim_job("walk", "sh -c 'echo walked > $ACTOR_RUN_OUT/w.txt'", sim=sim, candidates=candidates)
    with open_runner() as r:
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("succeeded", None, 1)
    started = events.of(AttemptStarted)
    assert [(s.offer.candidate, s.offer.gpu, s.offer.region) for s in started] == [(2, "A100", "us-east")]
    assert [e.machine.gpu for e in events.of(Leased)] == ["A100"]
    body = response(tmp_path, "walk")
    assert body["outcome"] == "succeeded"
    assert [(a["gpu"], a["region"], a["outcome"]) for a in body["attempts"]] == [("A100", "us-east", "succeeded")]
    assert (tmp_path / "out" / "latest" / "walk" / "seed-1" / "out" / "w.txt").read_text() == "walked\n"
    assert sim_machines(sim_dir) == []


def test_no_capacity_at_launch_walks_on_without_counting(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, tmp_path: Path
) -> None:
    # every sim launch is refused for capacity; the last candidate is this computer
    job = sim_job(
        "nocap",
        "sh -c 'echo fine'",
        sim={"no_capacity_rate": 1.0},
        candidates=[CandidateSpec(cloud="sim", gpu="A100"), CandidateSpec(cloud="local")],
        max_attempts=1,
    )
    with open_runner() as r:
        ended = r.submit(job).result(60)
    assert ended.outcome == "succeeded"
    failed = events.of(LeaseFailed)
    assert [f.failure for f in failed] == [Code.NO_CAPACITY] * 3  # the sim's three A100 places, one each
    assert len({e.offer.region for e in events.of(AttemptStarted) if e.offer.cloud == "sim"}) == 3
    assert events.of(Retrying) == []  # a walk is at once, not a retry after a backoff
    body = response(tmp_path, "nocap")
    assert [(a["cloud"], a["failure"]) for a in body["attempts"]] == [
        ("sim", "no_capacity"),
        ("sim", "no_capacity"),
        ("sim", "no_capacity"),
        ("local", None),
    ]
    assert [a["attempt"] for a in body["attempts"]] == [0, 1, 2, 3]


def test_no_stock_anywhere_ends_no_capacity(open_runner: Callable[..., Any], events: Any, sim_job: Any) -> None:
    # capacity_wait_s = 0: fail fast, as before the default wait
    job = sim_job("none", "true", candidates=[CandidateSpec(cloud="sim", gpu="B200")], capacity_wait_s=0.0)
    with open_runner() as r:
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("failed", Code.NO_CAPACITY, 0)
    assert "no candidate place has stock" in ended.detail
    assert events.of(AttemptStarted) == []
    assert events.of(WaitingForCapacity) == []


def test_jobs_beyond_the_stock_wait_for_their_batch_s_machines(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, regions: Any, sim_dir: Path
) -> None:
    """Concurrency above stock: with the default wait, a job finding no place with stock waits
    (it is its own batch that holds the stock) and runs when a machine is let go."""
    sim = {"regions": regions(("us-east", "A100", 2, 1.8))}
    jobs = [sim_job("crowd", "sh -c 'sleep 0.3'", seed=s, sim=sim) for s in range(5)]
    with open_runner(concurrency=5) as r:
        ended = [h.result(120) for h in [r.submit(j) for j in jobs]]
    assert [(e.outcome, e.failure) for e in ended] == [("succeeded", None)] * 5
    waiting = events.of(WaitingForCapacity)
    assert len(waiting) >= 3  # at most two ran at once
    assert all(w.wanted == "sim A100" and w.until > time.time() + 200 for w in waiting)  # the sim's 300 s
    # a create that lost the race for the last machine is a walk (no_capacity), never a counted failure
    assert {e.failure for e in events.of(AttemptEnded)} <= {None, Code.NO_CAPACITY}
    assert sim_machines(sim_dir) == []


def test_a_job_that_exits_non_zero_is_not_retried(
    open_runner: Callable[..., Any],
    events: Any,
    sim_job: Any,
    tmp_path: Path,
    ledger_machines: Any,
    sim_dir: Path,
) -> None:
    job = sim_job("exit3", "sh -c 'echo about to fail; exit 3'", max_attempts=3)
    with open_runner() as r:
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("failed", Code.JOB_FAILED, 1)
    assert "exited 3" in ended.detail
    assert len(events.of(AttemptStarted)) == 1
    assert events.of(Retrying) == []
    body = response(tmp_path, "exit3")
    assert (body["outcome"], body["failure"], body["exit_code"]) == ("failed", "job_failed", 3)
    assert len(body["attempts"]) == 1
    assert "about to fail" in (tmp_path / "out" / "latest" / "exit3" / "seed-1" / "log.txt").read_text()
    assert [m.state for m in ledger_machines()] == ["deleted"]
    assert sim_machines(sim_dir) == []


def test_a_stalled_job_is_retried_on_a_fresh_machine(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, tmp_path: Path, sim_dir: Path
) -> None:
    job = sim_job("stall", QUIET_FIRST.format(s="30.917"), setup_grace_s=0.5, max_attempts=2)
    with open_runner() as r:
        ended = r.submit(job).result(60)
        assert sleeping("30.917", tmp_path) == []  # the silent job was stopped with its machine
    assert (ended.outcome, ended.attempts) == ("succeeded", 2)
    stalls = events.of(Stalled)
    assert [(s.attempt, s.failure) for s in stalls] == [(0, Code.STALLED)]
    leased = events.of(Leased)
    assert [e.attempt for e in leased] == [0, 1]
    assert leased[0].machine.name != leased[1].machine.name  # a fresh machine
    assert leased[0].machine.id != leased[1].machine.id
    released = events.of(Released)
    assert [(e.machine, e.confirmed) for e in released] == [
        (leased[0].machine.name, True),
        (leased[1].machine.name, True),
    ]
    assert [(e.attempt, e.failure) for e in events.of(Retrying)] == [(1, Code.STALLED)]
    body = response(tmp_path, "stall")
    assert [(a["attempt"], a["outcome"], a["failure"]) for a in body["attempts"]] == [
        (0, "failed", "stalled"),
        (1, "succeeded", None),
    ]
    assert "ok-1" in (tmp_path / "out" / "latest" / "stall" / "seed-1" / "log.txt").read_text()
    assert sim_machines(sim_dir) == []


def test_a_job_that_stalls_every_time_ends_stalled_after_max_attempts(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, sim_dir: Path, tmp_path: Path
) -> None:
    job = sim_job("stall2", "sleep 31.917", setup_grace_s=0.4, max_attempts=2)
    with open_runner() as r:
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("failed", Code.STALLED, 2)
    assert "2 attempts used (max_attempts = 2)" in ended.detail
    names = [e.machine.name for e in events.of(Leased)]
    assert len(names) == 2
    assert len(set(names)) == 2
    assert sleeping("31.917", tmp_path) == []
    assert sim_machines(sim_dir) == []


def test_a_preempted_attempt_is_retried(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, sim_dir: Path, tmp_path: Path
) -> None:
    job = sim_job("pre", QUIET_FIRST.format(s="32.917"), max_attempts=2)
    with open_runner() as r:
        handle = r.submit(job)
        events.wait_for(lambda e: isinstance(e, JobStarted) and e.attempt == 0)
        first = events.of(Leased)[0].machine.name
        assert preempt_machine(sim_dir, first)
        ended = handle.result(60)
    assert (ended.outcome, ended.attempts) == ("succeeded", 2)
    ends = events.of(AttemptEnded)
    assert [(e.attempt, e.failure) for e in ends] == [(0, Code.PREEMPTED), (1, None)]
    assert events.of(Leased)[1].machine.name != first
    assert sleeping("32.917", tmp_path) == []
    assert sim_machines(sim_dir) == []


def test_a_machine_taken_between_its_upload_and_its_start_is_a_preemption_billed_to_then(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, sim_dir: Path, ledger_machines: Any
) -> None:
    """The start finds the machine gone: retried as a preemption, and charged, like the provider's
    bill, up to when the provider took it (not up to our delete, a poll later)."""
    job = sim_job("taken", "true", max_attempts=2)
    taken: list[str] = []

    def take_on_upload(e: Any) -> None:  # on the attempt's thread, before it starts the job
        if isinstance(e, Uploaded) and e.attempt == 0:
            [name] = sim_machines(sim_dir)
            assert preempt_machine(sim_dir, name)
            taken.append(name)

    with open_runner() as r:
        r.subscribe(take_on_upload)
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.attempts) == ("succeeded", 2)
    ends = events.of(AttemptEnded)
    assert [(e.attempt, e.failure) for e in ends] == [(0, Code.PREEMPTED), (1, None)]
    [bill] = [b for b in billing(sim_dir) if b.name == taken[0]]
    assert bill.preempted
    assert ends[0].usage.seconds == pytest.approx(bill.seconds, abs=1e-6)
    assert ends[0].usage.usd == pytest.approx(bill.usd, abs=1e-6)
    # the ledger has when its bill stopped too (a controller killed before the charge is settled to then)
    [row] = [m for m in ledger_machines() if m.name == taken[0]]
    recorded = msgspec.json.decode(row.machine, type=Machine)
    assert recorded.taken_at == pytest.approx(bill.created_at + bill.seconds, abs=1e-6)
    assert sim_machines(sim_dir) == []


def test_launch_failures_are_retried_at_the_next_place(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, tmp_path: Path, sim_dir: Path
) -> None:
    job = sim_job("lf", "true", sim={"launch_failure_rate": 1.0}, max_attempts=2)
    with open_runner() as r:
        ended = r.submit(job).result(60)
    assert (ended.outcome, ended.failure, ended.attempts) == ("failed", Code.LAUNCH_FAILED, 2)
    regions = [e.offer.region for e in events.of(AttemptStarted)]
    assert len(regions) == 2
    assert regions[0] != regions[1]  # launch_failed walks past the place before the retry
    assert [e.failure for e in events.of(Retrying)] == [Code.LAUNCH_FAILED]
    assert sim_machines(sim_dir) == []


def test_cancel_of_a_running_job(
    open_runner: Callable[..., Any], events: Any, sim_job: Any, ledger_machines: Any, sim_dir: Path, tmp_path: Path
) -> None:
    job = sim_job("cancel", "sleep 33.917")
    with open_runner() as r:
        handle = r.submit(job)
        events.wait_for(lambda e: isinstance(e, JobStarted))
        assert len(sim_machines(sim_dir)) == 1
        wait_until(lambda: sleeping("33.917", tmp_path))  # the job runs
        handle.cancel()
        ended = handle.result(60)
        # deleted before the job ended, not by the Runner's close
        assert sim_machines(sim_dir) == []
        assert sleeping("33.917", tmp_path) == []
    assert isinstance(ended, JobEnded)
    assert (ended.outcome, ended.failure, ended.attempts) == ("canceled", Code.CANCELED, 1)
    assert [e.confirmed for e in events.of(Released)] == [True]
    assert events.of(Retrying) == []
    assert [m.state for m in ledger_machines()] == ["deleted"]


def test_a_jobs_end_looks_for_a_checkpoint_only_where_there_may_be_one(
    open_runner: Callable[..., Any], sim_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a seed folder the job made, none of whose attempts asked for a checkpoint, there is none:
    its end looks for no `.checkpoint` (a system call per job in an end burst, bench/RESULTS.md item
    66). In a folder a run before it left, a `.checkpoint` there still goes. (A checkpoint an
    attempt asked for goes too: tests/supervisors/test_resume.py.)"""
    looked: list[str] = []
    stat = os.stat

    def counting_stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(path).endswith(".checkpoint"):
            looked.append(os.fspath(path))
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", counting_stat)
    fresh, used = sim_job("fresh", "echo fresh"), sim_job("used", "echo used")
    with open_runner() as r:
        r.start_run()
        left = r.seed_dir(used) / ".checkpoint"  # a run before this one left it there
        (left / "ckpt-1").mkdir(parents=True)
        assert [r.submit(j).result(60).outcome for j in (fresh, used)] == ["succeeded", "succeeded"]
        fresh_dir = r.seed_dir(fresh)
    assert (fresh_dir / "response.json").is_file()
    assert not [p for p in looked if p.startswith(os.fspath(fresh_dir))]  # main: looked once
    assert str(left) in looked
    assert not left.exists()


def test_a_jobs_end_keeps_the_last_attempts_outputs_and_drops_an_earlier_ones(tmp_path: Path) -> None:
    """Fetches write straight into the seed's folder. At the end: the last attempt's out/ stays (a
    failed job's too); an earlier attempt's, whose fetch failed before a retry that never ran,
    goes; a previous run's outputs no fetch replaced stay; the resume checkpoint goes."""
    def seed(name: str) -> Path:
        d = tmp_path / name
        (d / "out").mkdir(parents=True)
        (d / "out" / "result.txt").write_text("r\n")
        (d / "progress.jsonl").write_text("{}\n")
        (d / ".checkpoint").mkdir()
        (d / "log.txt").write_text("log\n")
        return d

    ran, refused = {"phases": {"lease": 1.0, "run": 30.0}}, {"phases": {"lease": 2.0}}
    cases = {
        "last-ran": ([refused, ran], True),   # a capacity miss, then the attempt that ran and fetched
        "earlier-ran": ([ran, refused], False),  # ran, its fetch failed; the retry never got a machine
        "none-ran": ([refused, refused], True),  # nothing fetched: what was there before stays
        "no-attempts": ([], True),
    }
    for name, (history, kept) in cases.items():
        d = seed(name)
        assert tidy_seed_dir(d, history) == d
        assert (d / "out" / "result.txt").exists() is kept, name
        assert (d / "progress.jsonl").exists() is kept, name
        assert not (d / ".checkpoint").exists(), name
        assert (d / "log.txt").read_text() == "log\n", name
