"""Supervision (DESIGN.md): a crash inside one job's subtree is that job's failure, never the batch's.

A crash is injected through the Runner's fault hook (actors.Context.at: the designed place a bug
would raise) at each step of one job's life; the other jobs finish, the crashed job ends `internal`
after its machine is deleted, and `cancel()`/`close()` still work.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actor_run.protocols.failures import Code
from actor_run.protocols.messages import JobStarted
from actor_run.supervisors.ledger import LedgerReader


class Crash(RuntimeError):
    """What the injected bug raises."""


def crash_at(step: str, key: str) -> Callable[[str, str], None]:
    def fault(at: str, job: str) -> None:
        if at == step and job == key:
            raise Crash(f"injected at {step}")

    return fault


@pytest.mark.parametrize("step", ["out_folder", "budget", "names", "response", "event:AttemptEnded",
                                  "event:_Offers"])
def test_a_crash_at_any_step_ends_that_job_internal_and_the_batch_goes_on(
        step: str, open_runner: Callable[..., Any], sim_job: Any, ledger_machines: Any, state_dir: Path,
        sim_dir: Path) -> None:
    with open_runner(concurrency=3, fault=crash_at(step, "t/seed-2")) as r:
        handles = [r.submit(sim_job("t", "echo ok", seed=s)) for s in (1, 2, 3)]
        ended = {h.key: h.result(timeout=120) for h in handles}
    assert ended["t/seed-1"].outcome == "succeeded"
    assert ended["t/seed-3"].outcome == "succeeded"
    crashed = ended["t/seed-2"]
    assert (crashed.outcome, crashed.failure) == ("failed", Code.INTERNAL)
    assert f"injected at {step}" in crashed.detail
    assert not list(sim_dir.glob("machines/*.json"))  # every machine deleted
    assert {m.state for m in ledger_machines()} <= {"deleted"}
    reader = LedgerReader(state_dir / "ledger.sqlite")
    try:
        states = {j["key"]: j["state"] for j in reader.jobs()}
    finally:
        reader.close()
    assert states == {"t/seed-1": "succeeded", "t/seed-2": "failed", "t/seed-3": "succeeded"}
    log = "\n".join(p.read_text() for p in state_dir.glob("runs/*/controller.log"))
    assert "Crash" in log or not log  # the exception in the run's log, when one was opened


def test_a_crash_while_the_machine_runs_deletes_it_first(
        open_runner: Callable[..., Any], events: Any, sim_job: Any, sim_dir: Path, ledger_machines: Any) -> None:
    """The job supervisor crashes (on a Cancel) while its attempt holds a machine: the attempt is
    stopped first, its lease deletes the machine, then the job ends `internal`; cancel and close work."""
    with open_runner(concurrency=2, fault=crash_at("event:Cancel", "t/seed-2")) as r:
        handles = {s: r.submit(sim_job("t", "sleep 40.917", seed=s)) for s in (1, 2)}
        for s in (1, 2):
            events.wait_for(lambda e, s=s: isinstance(e, JobStarted) and e.seed == s)
        assert len(list(sim_dir.glob("machines/*.json"))) == 2
        handles[2].cancel()
        crashed = handles[2].result(timeout=120)
        assert (crashed.outcome, crashed.failure) == ("failed", Code.INTERNAL)
        assert len(list(sim_dir.glob("machines/*.json"))) == 1  # its machine went before it ended
        assert not handles[1].done()  # the other job runs on
        r.cancel()
    assert handles[1].result(0).failure == Code.CANCELED
    assert not list(sim_dir.glob("machines/*.json"))
    assert {m.state for m in ledger_machines()} == {"deleted"}


def test_a_crash_of_the_batch_supervisor_ends_every_job_and_cancel_and_close_still_work(
        open_runner: Callable[..., Any], events: Any, sim_job: Any, sim_dir: Path, ledger_machines: Any) -> None:
    with open_runner(concurrency=2, fault=crash_at("batch:CancelJob", "t/seed-1")) as r:
        handles = [r.submit(sim_job("t", "sleep 40.917", seed=s)) for s in (1, 2)]
        for s in (1, 2):
            events.wait_for(lambda e, s=s: isinstance(e, JobStarted) and e.seed == s)
        handles[0].cancel()  # the batch supervisor raises on it
        ended = [h.result(timeout=120) for h in handles]
        assert {(e.outcome, e.failure) for e in ended} == {("failed", Code.INTERNAL)}
        assert not list(sim_dir.glob("machines/*.json"))  # each job's machine deleted first
        r.cancel()  # the batch is gone: nothing to cancel, and no ActorDeadError
        handles[1].cancel()
    assert {m.state for m in ledger_machines()} == {"deleted"}
