"""A whole attempt (actors/attempt.py) on the `local` cloud (real sandboxes, real `sh` jobs) and the
`sim` cloud: every way it ends tells the parent `AttemptEnded`, and leaves no machine, no process."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pykka
import pytest
from actor_kit import LOCAL, SIM, Mailbox, ProbeHandle, fast_sim, wait_actors_stopped, wait_until
from support.waits import poll

from actor_run.actors import AttemptActor, Context, CostMeterActor, HeartbeatActor, LeaseActor, TransferActor
from actor_run.actors.pool import live_actors
from actor_run.protocols.attempt_time import AttemptTime
from actor_run.protocols.clouds.sim import SimCloud, SimSettings, billing, sim_machines
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import (
    AttemptEnded,
    AttemptStarted,
    Cancel,
    Exited,
    Fetched,
    JobStarted,
    Leased,
    LeaseFailed,
    LeaseRequested,
    Metered,
    Offer,
    Progress,
    Released,
    Uploaded,
)
from actor_run.protocols.specs import Job, PolicySpec
from actor_run.supervisors.ledger import Ledger, LedgerReader

POLICY = PolicySpec(poll_s=0.1, stall_after_s=30.0, lost_after_s=5.0, deadline_margin_s=60.0)


def job(command: str, **kw: Any) -> Job:
    return Job(name="t", command=command, seed=1, timeout_s=60.0, policy=POLICY, **kw)


@pytest.fixture
def seed_dir(tmp_path: Path) -> Path:
    return tmp_path / "out" / "t" / "seed-1"


@pytest.fixture
def run_attempt(
    ctx: Context, probe: ProbeHandle, seed_dir: Path,
) -> Iterator[Callable[..., pykka.ActorRef[Any]]]:
    started: list[pykka.ActorRef[Any]] = []

    def start(j: Job, *, offer: Offer = LOCAL, setup_grace_s: float = 10.0, context: Context | None = None,
              attempt: int = 0) -> pykka.ActorRef[Any]:
        ref = AttemptActor.start(context or ctx, probe.ref, job=j, attempt=attempt, offer=offer,
                                 timebox=AttemptTime(timeout_s=j.timeout_s, setup_grace_s=setup_grace_s,
                                                     margin_s=j.policy.deadline_margin_s),
                                 seed_dir=seed_dir)
        started.append(ref)
        return ref

    try:
        yield start
    finally:
        for ref in started:
            ref.stop()


def local_machines(state_dir: Path) -> list[str]:
    return sorted(p.name for p in (state_dir / "local").glob("*")) if (state_dir / "local").exists() else []


def gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def processes_naming(path: Path) -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(str(path) in p for p in proc.info["cmdline"] or []):
            out.append(proc.pid)
    return out


def ended(probe: ProbeHandle, attempt: pykka.ActorRef[Any], timeout: float = 20.0) -> AttemptEnded:
    """The parent's AttemptEnded; then the attempt and all its children have stopped."""
    end = probe.wait_for(AttemptEnded, timeout=timeout)
    assert attempt.actor_stopped.wait(10), "the attempt did not stop after AttemptEnded"
    assert wait_actors_stopped(10) == []
    assert len(probe.box.of(AttemptEnded)) == 1
    return end


def assert_no_machine(state_dir: Path, reader: LedgerReader, ledger: Ledger) -> None:
    assert local_machines(state_dir) == []
    ledger.flush()
    rows = reader.machines()
    assert rows, "the lease recorded no machine"
    assert [(r.state, r.phase) for r in rows] == [("deleted", "deleted")] * len(rows)


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "run.sh").write_text(
        'echo \'{"stage": "load"}\' >> "$ACTOR_RUN_PROGRESS"\n'
        'echo "training seed $ACTOR_RUN_SEED"\n'
        'cp "$ACTOR_RUN_IN/data/data.csv" "$ACTOR_RUN_OUT/copy.csv"\n'
        'echo "seed $ACTOR_RUN_SEED attempt $ACTOR_RUN_ATTEMPT" > "$ACTOR_RUN_OUT/result.txt"\n'
        'echo \'{"stage": "train", "step": 1}\' >> "$ACTOR_RUN_PROGRESS"\n'
    )
    return code


def test_a_successful_attempt(
    run_attempt: Any, probe: ProbeHandle, emitted: Mailbox, code_dir: Path, tmp_path: Path, seed_dir: Path,
    state_dir: Path, reader: LedgerReader, ledger: Ledger,
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    attempt = run_attempt(job("sh run.sh", code=str(code_dir), inputs={"data": str(data)}))
    end = ended(probe, attempt)
    assert (end.job, end.seed, end.attempt) == ("t", 1, 0)
    assert (end.outcome, end.failure, end.exit_code) == ("succeeded", None, 0), end.detail
    assert end.offer == LOCAL
    assert end.usage.usd == 0.0
    assert not end.usage.at_least
    assert {"lease", "upload", "start", "run", "fetch", "release"} <= set(end.phases)

    out = seed_dir / "out"  # fetched straight into the seed's folder
    assert (out / "result.txt").read_text() == "seed 1 attempt 0\n"
    assert (out / "copy.csv").read_text() == "a,b\n1,2\n"
    assert not (seed_dir / "response.json").exists()  # the host's exit record stays there: the poll read it
    assert not (seed_dir / ".attempts").exists()
    log = (seed_dir / "log.txt").read_text()
    assert re.match(r"--- (run [0-9a-f]+ )?attempt 0 on local this-computer", log), log[:200]
    assert "training seed 1\n" in log

    assert_no_machine(state_dir, reader, ledger)
    kinds = [type(e) for e in emitted.of(object)]
    for kind in (AttemptStarted, LeaseRequested, Leased, Uploaded, JobStarted, Progress, Exited, Fetched,
                 Released):
        assert kind in kinds, kind.__name__
    order = [AttemptStarted, Leased, Uploaded, JobStarted, Exited, Fetched, Released]
    assert [k for k in kinds if k in order] == order
    assert [p.stage for p in emitted.of(Progress)] == ["load", "train"]


def test_a_job_exiting_non_zero_is_job_failed(
    run_attempt: Any, probe: ProbeHandle, seed_dir: Path, state_dir: Path, reader: LedgerReader,
    ledger: Ledger,
) -> None:
    attempt = run_attempt(job("echo partial > $ACTOR_RUN_OUT/partial.txt; echo oops >&2; exit 3"))
    end = ended(probe, attempt)
    assert (end.outcome, end.failure, end.exit_code) == ("failed", Code.JOB_FAILED, 3)
    assert "exited 3" in end.detail
    # what it wrote is fetched all the same (for a look at what went wrong)
    assert (seed_dir / "out" / "partial.txt").read_text() == "partial\n"
    assert "oops" in (seed_dir / "log.txt").read_text()
    assert_no_machine(state_dir, reader, ledger)


def test_cancel_while_running_stops_the_job_and_deletes_the_machine(
    run_attempt: Any, probe: ProbeHandle, emitted: Mailbox, state_dir: Path, reader: LedgerReader,
    ledger: Ledger,
) -> None:
    attempt = run_attempt(job("sleep 30"))
    started = emitted.wait_for(JobStarted)
    assert not gone(started.pid)
    leased = emitted.wait_for(Leased)
    attempt.tell(Cancel())
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.CANCELED)
    assert end.exit_code is None
    assert gone(started.pid)
    assert processes_naming(Path(leased.machine.root)) == []
    assert_no_machine(state_dir, reader, ledger)
    assert not emitted.of(Exited)


def test_cancel_while_the_machine_is_launching(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox,
) -> None:
    ctx = make_context(sim=SimSettings(launch_latency_s=0.5, delete_latency_s=0.0))
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    attempt = run_attempt(job("sleep 30"), offer=SIM, context=ctx)
    emitted.wait_for(LeaseRequested)
    attempt.tell(Cancel(detail="ctrl-c"))
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.CANCELED)
    assert "ctrl-c" in end.detail
    assert sim_machines(sim.dir) == []
    assert not emitted.of(JobStarted)


def test_a_silent_job_is_stalled(
    run_attempt: Any, probe: ProbeHandle, emitted: Mailbox, state_dir: Path, reader: LedgerReader,
    ledger: Ledger,
) -> None:
    t0 = time.time()
    attempt = run_attempt(job("sleep 30"), setup_grace_s=1.0)
    started = emitted.wait_for(JobStarted)
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.STALLED)
    assert time.time() - t0 >= 1.0
    assert gone(started.pid)
    assert_no_machine(state_dir, reader, ledger)


@pytest.mark.parametrize("child", [HeartbeatActor, TransferActor, LeaseActor], ids=lambda c: c.__name__)
def test_an_exception_in_a_child_ends_the_attempt_internal(
    child: type[pykka.ThreadingActor], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox,
    state_dir: Path, reader: LedgerReader, ledger: Ledger,
) -> None:
    attempt = run_attempt(job("sleep 30"))
    started = emitted.wait_for(JobStarted)
    refs = [r for r in [*live_actors(), *pykka.ActorRegistry.get_all()] if r.actor_class is child]
    assert len(refs) == 1
    refs[0].tell("an unknown message")
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.INTERNAL)
    assert "TypeError" in end.detail
    assert child.__name__.removesuffix("Actor").lower() in end.detail
    assert gone(started.pid)
    assert_no_machine(state_dir, reader, ledger)


def test_an_exception_in_the_attempt_still_deletes_the_machine_and_tells_the_parent(
    run_attempt: Any, probe: ProbeHandle, emitted: Mailbox, state_dir: Path, reader: LedgerReader,
    ledger: Ledger,
) -> None:
    attempt = run_attempt(job("sleep 30"))
    started = emitted.wait_for(JobStarted)
    leased = emitted.wait_for(Leased)
    attempt.tell("an unknown message")
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.INTERNAL)
    assert "TypeError" in end.detail
    assert gone(started.pid)
    assert processes_naming(Path(leased.machine.root)) == []
    assert_no_machine(state_dir, reader, ledger)


def test_an_exception_in_the_attempt_still_reports_what_the_machine_cost(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox,
) -> None:
    ctx = make_context(sim=fast_sim())
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    attempt = run_attempt(job("sleep 30"), offer=SIM, context=ctx)
    emitted.wait_for(JobStarted)
    metered = emitted.wait_for(Metered)
    assert metered.usd > 0
    attempt.tell("an unknown message")
    end = ended(probe, attempt)
    assert end.failure == Code.INTERNAL
    assert sim_machines(sim.dir) == []
    assert end.usage.usd >= metered.usd


def assert_logged_no_machine(seed_dir: Path, failure: Code) -> None:
    """The log says there was no machine once, under one header (whoever wrote the header)."""
    lines = (seed_dir / "log.txt").read_text().splitlines()
    assert len(lines) == 2
    assert re.match(r"--- (run [0-9a-f]+ )?attempt 0 on sim", lines[0]), lines[0]
    assert lines[1].startswith(f"no machine: {failure}: ")


def test_a_launch_failure_ends_the_attempt_launch_failed_with_no_machine(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox,
    reader: LedgerReader, seed_dir: Path,
) -> None:
    ctx = make_context(sim=fast_sim(launch_failure_rate=1.0))
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    attempt = run_attempt(job("true"), offer=SIM, context=ctx)
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.LAUNCH_FAILED)
    assert emitted.wait_for(LeaseFailed).failure == Code.LAUNCH_FAILED
    assert sim_machines(sim.dir) == []
    assert end.usage.usd == 0.0
    [row] = reader.machines()
    assert (row.state, row.reason) == ("deleted", "create refused: launch_failed")
    assert_logged_no_machine(seed_dir, Code.LAUNCH_FAILED)


def test_a_refused_create_starts_no_watcher_and_logs_one_header(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox, seed_dir: Path,
) -> None:
    """The meter and the transfer start on `Leased`, the heartbeat once the job runs, each with its
    first message (bench/RESULTS.md, item 55): while the create is out only the lease lives, and a
    refused create ends with the attempt's header and the line saying there was no machine (main
    started the three watchers while the create was out, the pool being idle)."""
    watchers = (HeartbeatActor, CostMeterActor, TransferActor)
    ctx = make_context(sim=SimSettings(launch_latency_s=0.5, delete_latency_s=0.0, no_capacity_rate=1.0))
    attempt = run_attempt(job("true"), offer=SIM, context=ctx)
    emitted.wait_for(LeaseRequested)
    seen: set[str] = set()
    def refused() -> bool:  # sampling which actors live at each poll, until the refusal (0.5 s)
        seen.update(r.actor_class.__name__ for r in live_actors() if r.actor_class in watchers)
        return bool(emitted.of(LeaseFailed))

    poll(refused, 10, "the refusal", every=0.01)
    assert seen == set()
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.NO_CAPACITY)
    assert_logged_no_machine(seed_dir, Code.NO_CAPACITY)


def test_an_attempt_whose_job_never_started_logs_its_header(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, seed_dir: Path, tmp_path: Path,
) -> None:
    """Leased, then the upload refused (an input that does not exist): no heartbeat ever started, and
    the attempt's part of log.txt is its header, as when the heartbeat wrote it on `Leased`."""
    ctx = make_context(sim=fast_sim())
    attempt = run_attempt(job("true", inputs={"weights": str(tmp_path / "nowhere.bin")}), offer=SIM, context=ctx)
    end = ended(probe, attempt)
    assert (end.outcome, end.failure) == ("failed", Code.INPUT)
    lines = (seed_dir / "log.txt").read_text().splitlines()
    assert len(lines) == 1, lines
    assert re.match(r"--- (run [0-9a-f]+ )?attempt 0 on sim .*---$", lines[0]), lines[0]


def test_a_priced_attempt_is_metered_and_billed(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox,
) -> None:
    ctx = make_context(sim=fast_sim())
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    attempt = run_attempt(job("sleep 0.6; echo done > $ACTOR_RUN_OUT/r.txt"), offer=SIM, context=ctx)
    end = ended(probe, attempt)
    assert end.outcome == "succeeded", end.detail
    metered = emitted.of(Metered)
    assert metered, "no Metered on the event bus"
    assert all(0 < m.usd <= end.usage.usd for m in metered)
    assert not end.usage.at_least
    [bill] = billing(sim.dir)
    assert end.usage.seconds == pytest.approx(bill.seconds, abs=1.0)
    assert end.usage.usd == pytest.approx(bill.seconds * 1.8 / 3600, abs=1.0 * 1.8 / 3600)
    assert sim_machines(sim.dir) == []


def test_a_sim_sandbox_attempt_succeeds_and_cleans_up(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, seed_dir: Path,
) -> None:
    ctx = make_context(sim=fast_sim())
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    attempt = run_attempt(job("echo sim > $ACTOR_RUN_OUT/where.txt"), offer=SIM, context=ctx)
    end = ended(probe, attempt)
    assert end.outcome == "succeeded", end.detail
    assert (seed_dir / "out" / "where.txt").read_text() == "sim\n"
    assert sim_machines(sim.dir) == []
    wait_until(lambda: processes_naming(sim.dir / "sandboxes") == [], what="no process left in the sandboxes")



def test_a_cancelled_attempts_watchers_are_silent_while_its_delete_is_out_and_stop_after(
    make_context: Callable[..., Context], run_attempt: Any, probe: ProbeHandle, emitted: Mailbox,
) -> None:
    """At the release the heartbeat's polls and the meter's figures stop at once (one flag), but
    their actors stop only with `Released`: their stops (trio cancels on the reactor) come after
    the delete, not ahead of it (ten thousand cancelled at once: bench/RESULTS.md, item 40)."""
    ctx = make_context(sim=SimSettings(launch_latency_s=0.01, delete_latency_s=1.0, virtual=True,
                                       virtual_job_s=60.0))
    attempt = run_attempt(job("x"), offer=SIM, context=ctx)
    emitted.wait_for(JobStarted)
    emitted.wait_for(Metered)
    watchers = [r for r in live_actors() if r.actor_class in (HeartbeatActor, CostMeterActor)]
    assert len(watchers) == 2
    asked = time.monotonic()
    cancelled_at = time.time()
    attempt.tell(Cancel())
    alive_during_delete = False

    def released() -> bool:  # sampling the watchers at each poll, until Released (the delete takes 1 s)
        nonlocal alive_during_delete
        if emitted.of(Released):
            return True
        if time.monotonic() - asked >= 0.3 and all(r.is_alive() for r in watchers):
            alive_during_delete = True
        return False

    poll(released, 20, "Released", every=0.01)
    assert alive_during_delete  # still there 0.3 s into the 1 s delete
    end = ended(probe, attempt)  # and stopped with the attempt
    assert end.failure == Code.CANCELED
    assert all(not r.is_alive() for r in watchers)
    assert [m for m in emitted.of(Metered) if m.t > cancelled_at] == []
