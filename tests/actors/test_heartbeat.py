"""The heartbeat (actors/heartbeat.py): exit, progress, the log tail, and each kind of stall, watching a
real job on a real machine (`local`, or a `sim` sandbox for preemption)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import psutil
import pykka
import pytest
from actor_kit import SIM, Machines, Mailbox, ProbeHandle, fast_sim, wait_until

from actor_run.actors import Context, HeartbeatActor
from actor_run.actors.flag import Flag
from actor_run.actors.ticks import _CLOCKS
from actor_run.protocols.clouds.sim import SimCloud, preempt_machine
from actor_run.protocols.clouds.virtual import VirtualWorkspace
from actor_run.protocols.failures import Code
from actor_run.protocols.hosts.workspace import PollResult, Workspace
from actor_run.protocols.messages import ChildFailed, Exited, Progress, Stalled, Watch

T = TypeVar("T")


def progress(**line: Any) -> str:
    """A shell command that appends one progress line."""
    return f"echo '{json.dumps(line)}' >> \"$ACTOR_RUN_PROGRESS\""


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "seed-log.txt"


@pytest.fixture
def watch(ctx: Context, probe: ProbeHandle, log_path: Path) -> Iterator[Callable[..., pykka.ActorRef[Any]]]:
    """Start a HeartbeatActor on a started job; stopped at teardown."""
    started: list[pykka.ActorRef[Any]] = []

    def make(machine: str, work: str, pid: int, *, context: Context | None = None,
             setup_grace_s: float = 30.0, stall_after_s: float = 30.0, timeout_s: float = 60.0,
             launched_at: float | None = None, reattached: bool = False, poll_s: float = 0.1,
             polls_off: Flag | None = None, log_header: str = "") -> pykka.ActorRef[Any]:
        ref = HeartbeatActor.start(
            context or ctx, probe.ref, job="t", seed=1, attempt=0, poll_s=poll_s, setup_grace_s=setup_grace_s,
            stall_after_s=stall_after_s, lost_after_s=5.0, timeout_s=timeout_s, log_path=log_path,
            polls_off=polls_off, log_header=log_header,
        )
        started.append(ref)
        ref.tell(Watch(machine=machine, work=work, pid=pid, launched_at=launched_at or time.time(),
                       reattached=reattached))
        return ref

    try:
        yield make
    finally:
        for ref in started:
            ref.stop()


def test_a_job_that_exits_0_is_exited_0_with_its_progress(
    machines: Machines, probe: ProbeHandle, watch: Any, emitted: Mailbox, log_path: Path,
) -> None:
    command = "; ".join([
        progress(stage="setup"), "echo line one", progress(stage="train", step=1, loss=0.5),
        "echo line two", progress(stage="train", step=2, loss=0.25), "exit 0",
    ])
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, command)
        watch(machine.name, work, pid)
        exited = probe.wait_for(Exited)
        assert (exited.job, exited.seed, exited.attempt, exited.exit_code) == ("t", 1, 0, 0)
        said = emitted.of(Progress)
        assert [p.stage for p in said] == ["setup", "train", "train"]
        assert [p.line.get("step") for p in said] == [None, 1, 2]
        assert said[-1].line == {"stage": "train", "step": 2, "loss": 0.25}
        assert (said[-1].job, said[-1].seed, said[-1].attempt) == ("t", 1, 0)
        assert said[-1].t <= exited.t  # read before the exit was told
        assert not probe.box.of(Progress)  # no checkpoint named: nothing for the parent
        assert log_path.read_text() == "line one\nline two\n"
        assert not probe.box.of(Stalled)


def test_a_progress_line_with_nan_is_progress_all_the_same(
    machines: Machines, probe: ProbeHandle, watch: Any, emitted: Mailbox,
) -> None:
    # what Python's json.dumps writes for a diverged loss: not strict JSON, still a sign of life
    command = f"{progress(stage='train', step=1, loss=float('nan'))}; exit 0"
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, command)
        watch(machine.name, work, pid)
        probe.wait_for(Exited)
        [said] = emitted.of(Progress)
        assert (said.stage, said.line["step"]) == ("train", 1)
        assert math.isnan(said.line["loss"])


def test_an_exit_is_seen_when_the_process_ends_not_at_the_next_poll(
    machines: Machines, probe: ProbeHandle, watch: Any, log_path: Path,
) -> None:
    """This computer's host tells the heartbeat when the job's process ends (a pidfd): with polls
    a minute apart, the exit is still told within moments of it."""
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "echo started; sleep 1; echo done; exit 4")
        watch(machine.name, work, pid, poll_s=60.0, setup_grace_s=600.0, stall_after_s=600.0, timeout_s=600.0)
        exited = probe.wait_for(Exited, timeout=20)
        assert exited.exit_code == 4
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert log_path.read_text() == "started\ndone\n"  # the final poll read the log's tail too


def test_a_job_that_exits_3_is_exited_3(machines: Machines, probe: ProbeHandle, watch: Any) -> None:
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "echo failing >&2; exit 3")
        watch(machine.name, work, pid)
        assert probe.wait_for(Exited).exit_code == 3


def test_the_log_tail_is_appended_to_the_log_file(
    machines: Machines, probe: ProbeHandle, watch: Any, log_path: Path,
) -> None:
    log_path.write_text("--- attempt 0 ---\n")
    # more than one poll's worth of time between the lines: the tail arrives in pieces
    command = "echo first; sleep 0.3; echo second; sleep 0.3; printf 'third, no newline'"
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, command)
        watch(machine.name, work, pid)
        probe.wait_for(Exited)
        assert log_path.read_text() == "--- attempt 0 ---\nfirst\nsecond\nthird, no newline"


def test_a_silent_job_stalls_after_the_setup_grace(
    machines: Machines, probe: ProbeHandle, watch: Any,
) -> None:
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "sleep 30")
        t0 = time.time()
        watch(machine.name, work, pid, setup_grace_s=0.5, launched_at=t0)
        stalled = probe.wait_for(Stalled)
        assert stalled.failure == Code.STALLED
        assert "past setup" in stalled.detail
        assert time.time() - t0 >= 0.5
        assert not probe.box.of(Exited)


def test_setup_stages_do_not_end_the_setup_grace(
    machines: Machines, probe: ProbeHandle, watch: Any, emitted: Mailbox,
) -> None:
    """A job that only says `setup`/`download` is still in its grace: it stalls on the long window."""
    command = f"{progress(stage='setup')}; {progress(stage='download')}; sleep 30"
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, command)
        t0 = time.time()
        watch(machine.name, work, pid, setup_grace_s=1.0, stall_after_s=0.2, launched_at=t0)
        stalled = probe.wait_for(Stalled)
        assert stalled.failure == Code.STALLED
        assert time.time() - t0 >= 1.0, "the tight window was applied during setup"
        assert [p.stage for p in emitted.of(Progress)] == ["setup", "download"]


def test_a_job_past_setup_that_goes_silent_stalls_after_stall_after_s(
    machines: Machines, probe: ProbeHandle, watch: Any, emitted: Mailbox,
) -> None:
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, f"{progress(stage='train', step=1)}; sleep 30")
        watch(machine.name, work, pid, setup_grace_s=30.0, stall_after_s=0.5)
        train = emitted.wait_for(Progress)
        assert train.stage == "train"
        stalled = probe.wait_for(Stalled)
        assert stalled.failure == Code.STALLED
        assert "no progress" in stalled.detail
        assert stalled.t - train.t >= 0.5


def test_a_job_past_its_timeout_is_stalled_job_failed(
    machines: Machines, probe: ProbeHandle, watch: Any,
) -> None:
    with machines.open() as (machine, ws):
        # it keeps reporting progress: only its timeout can end it
        work, pid = machines.start_job(ws, f"while :; do {progress(stage='train')}; sleep 0.05; done")
        watch(machine.name, work, pid, timeout_s=0.5)
        stalled = probe.wait_for(Stalled)
        assert stalled.failure == Code.JOB_FAILED
        assert "timeout_s" in stalled.detail


def test_the_windows_are_anchored_at_the_launch(machines: Machines, probe: ProbeHandle, watch: Any) -> None:
    """A heartbeat that (re)attaches late gives a silent job no fresh window."""
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "sleep 30")
        launched_at = time.time() - 100
        watch(machine.name, work, pid, setup_grace_s=50.0, timeout_s=1000.0, launched_at=launched_at)
        stalled = probe.wait_for(Stalled, timeout=5)
        assert stalled.failure == Code.STALLED


def test_a_reattached_heartbeat_gives_a_silent_job_no_fresh_window(
    machines: Machines, probe: ProbeHandle, watch: Any, emitted: Mailbox,
) -> None:
    """What the first poll after a reattach reads was written before: life as of the files' times."""
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, f"{progress(stage='train', step=1)}; sleep 30")
        launched_at = time.time()
        first = watch(machine.name, work, pid, stall_after_s=1.0, launched_at=launched_at)
        emitted.wait_for(Progress)
        probe.wait_for(Stalled)  # silent for stall_after_s since its one line
        first.stop()
        # a controller that comes back: a new heartbeat, anchored at the same launch
        attached = time.time()
        watch(machine.name, work, pid, stall_after_s=1.0, launched_at=launched_at, reattached=True)
        again = probe.wait_for(Stalled)
        assert again.failure == Code.STALLED
        assert again.t - attached < 0.9, f"the reattached heartbeat waited {again.t - attached:.1f} s more"


def test_a_preempted_sim_machine_is_stalled_preempted(
    make_context: Callable[..., Context], probe: ProbeHandle, watch: Any, emitted: Mailbox,
) -> None:
    ctx = make_context(sim=fast_sim())
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    with Machines(ctx).open(SIM) as (machine, ws):
        work, pid = Machines(ctx).start_job(ws, f"{progress(stage='train')}; sleep 30")
        watch(machine.name, work, pid, context=ctx)
        emitted.wait_for(Progress)  # it runs and is watched
        assert preempt_machine(sim.dir, machine.name)
        stalled = probe.wait_for(Stalled)
        assert stalled.failure == Code.PREEMPTED
        assert "preempted" in stalled.detail
        wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                   what="the preempted job's process ended")


def test_a_virtual_job_is_watched_by_no_task_and_its_exit_seen_at_its_moment(
    make_context: Callable[..., Context], probe: ProbeHandle, watch: Any,
) -> None:
    """A workspace that knows when its job ends (a virtual one: `exit_at`) needs no task waiting
    for an exit hint (about 25 objects the collector walks per job, issue 30), and one whose poll has
    nothing to wait on (`PollsNow`) no poll loop either: the shared clock's pass steps it, and the
    heap of alarms at the job's end, instead of at its next beat, 30 s later."""
    ctx = make_context(sim=fast_sim(virtual=True, virtual_job_s=0.5))
    with Machines(ctx).open(SIM) as (machine, ws):
        work, pid = Machines(ctx).start_job(ws, "train")
        before = ctx.reactor.statistics()
        started = time.monotonic()
        watch(machine.name, work, pid, context=ctx, poll_s=30.0)
        exited = probe.wait_for(Exited, timeout=20)
        assert exited.exit_code == 0
        assert time.monotonic() - started < 20, "the exit waited for the next beat (30 s)"
        after = ctx.reactor.statistics()
        assert after.tasks_started == before.tasks_started  # no loop, no exit hint: no task at all
        assert after.tasks_running == before.tasks_running


def _steps(ws: Workspace, work: str) -> int:
    """How often the virtual job was polled (each poll is one step of it: protocols/clouds/virtual.py)."""
    assert isinstance(ws, VirtualWorkspace)
    return ws._machine.jobs[work].steps


def _watch_many(ctx: Context, probe: ProbeHandle, machine: str, works: list[tuple[str, int]], log_dir: Path,
                *, poll_s: float, polls_off: Flag | None = None) -> list[pykka.ActorRef[Any]]:
    refs = []
    for attempt, (work, pid) in enumerate(works):
        ref = HeartbeatActor.start(
            ctx, probe.ref, job="t", seed=1, attempt=attempt, poll_s=poll_s, setup_grace_s=60.0,
            stall_after_s=60.0, lost_after_s=60.0, timeout_s=60.0, log_path=log_dir / f"log-{attempt}.txt",
            polls_off=polls_off,
        )
        refs.append(ref)
        ref.tell(Watch(machine=machine, work=work, pid=pid, launched_at=time.time()))
    return refs


def _on_reactor(ctx: Context, fn: Callable[[], T]) -> T:
    """`fn()` run on the reactor thread, between two of its callbacks (never in the middle of a clock's
    pass), with no task: the tests count tasks."""
    got: list[T] = []
    done = threading.Event()

    def run() -> None:
        got.append(fn())
        done.set()

    ctx.reactor.soon(run)
    assert done.wait(10)
    return got[0]


def _subscribed(ctx: Context, period: float) -> int:
    """How many watches (and meters) the reactor's shared clock of `period` beats for now."""

    def count() -> int:
        try:
            clock = _CLOCKS.get().get(period)
        except LookupError:
            return 0
        return 0 if clock is None else len(clock.subs)

    return _on_reactor(ctx, count)


def test_virtual_jobs_are_polled_every_beat_in_the_clocks_one_pass_with_no_task_each(
    make_context: Callable[..., Context], probe: ProbeHandle, tmp_path: Path,
) -> None:
    """Twenty virtual jobs of one period: each is polled at every beat of the shared clock (so its
    `alive` is written every `poll_s`), by the clock's one pass, with no reactor task per job (trio's
    wait, reschedule and task switch per poll were 30 % of the CPU between the bursts at N=3000,
    bench/RESULTS.md items 65-66). A stop, or the attempt's switch, takes a job out of the pass at once."""
    ctx = make_context(sim=fast_sim(virtual=True, virtual_job_s=600.0))
    period = 0.05
    machines = Machines(ctx)
    with machines.open(SIM) as (machine, ws):
        works = [machines.start_job(ws, "train", attempt=a) for a in range(20)]
        before = ctx.reactor.statistics().tasks_started
        off = Flag()
        refs = _watch_many(ctx, probe, machine.name, works[:19], tmp_path, poll_s=period)
        refs += _watch_many(ctx, probe, machine.name, works[19:], tmp_path, poll_s=period, polls_off=off)
        try:
            wait_until(lambda: _subscribed(ctx, period) == 20, 10, "every watch on the clock")
            first = _on_reactor(ctx, lambda: [_steps(ws, w) for w, _ in works])  # between two passes
            t0 = time.monotonic()
            wait_until(lambda: min(_steps(ws, w) for w, _ in works) >= max(first) + 10, 20, "ten beats")
            elapsed = time.monotonic() - t0
            assert ctx.reactor.statistics().tasks_started == before  # no task per job, nor per poll
            # every job at every beat: each took as many steps since as every other
            steps = _on_reactor(ctx, lambda: [_steps(ws, w) for w, _ in works])
            assert len({n - m for n, m in zip(steps, first, strict=True)}) == 1
            assert elapsed < 10 * period * 20, "the beats stretched far past the period"
            # the attempt's switch: out of the pass at its next beat, the actor alive
            off.set()
            wait_until(lambda: _subscribed(ctx, period) == 19, 10, "the switched-off watch left the clock")
            switched = _steps(ws, works[19][0])
            assert refs[19].is_alive()
            # a stop: out of the pass too
            refs[0].stop()
            wait_until(lambda: _subscribed(ctx, period) == 18, 10, "the stopped watch left the clock")
            stopped = _steps(ws, works[0][0])
            others = _steps(ws, works[1][0])
            wait_until(lambda: _steps(ws, works[1][0]) >= others + 5, 10, "five more beats for the others")
            assert _steps(ws, works[19][0]) == switched
            assert _steps(ws, works[0][0]) == stopped
            assert not probe.box.of(Stalled)
        finally:
            for ref in refs:
                ref.stop()
        wait_until(lambda: _subscribed(ctx, period) == 0, 10, "every watch left the clock")


class _Broken:
    """A workspace whose poll answers at once but fails in a way no host error is (a bug)."""

    root = "/broken"

    def exit_at(self, work: str, pid: int) -> float | None:
        return math.inf

    def poll_now(self, work: str, pid: int, progress_at: int, log_at: int) -> PollResult | None:
        raise RuntimeError("a bug in the poll")

    def beat_now(self, work: str) -> bool:
        return True

    async def poll(self, work: str, pid: int, progress_at: int, log_at: int, log_max: int = 0) -> PollResult:
        raise RuntimeError("a bug in the poll")


def test_one_watch_s_failing_poll_fails_its_heartbeat_and_no_other_s_polls(
    make_context: Callable[..., Context], probe: ProbeHandle, tmp_path: Path,
) -> None:
    """A poll that raises what no host raises is its heartbeat's failure (`ChildFailed`, as a loop's
    error was), and the clock's pass goes on for every other watch; a preempted machine (the poll
    that must wait: the provider's record written on a thread) is its job's `Stalled(preempted)`,
    also alone."""
    ctx = make_context(sim=fast_sim(virtual=True, virtual_job_s=600.0))
    sim = ctx.clouds["sim"]
    assert isinstance(sim, SimCloud)
    period = 0.05
    machines = Machines(ctx)
    with machines.open(SIM) as (machine, ws), machines.open(SIM) as (doomed, doomed_ws):
        ctx.workspaces["broken"] = cast(Workspace, _Broken())
        (tmp_path / "b").mkdir()
        (tmp_path / "d").mkdir()
        works = [machines.start_job(ws, "train", attempt=a) for a in range(3)]
        doomed_work, doomed_pid = machines.start_job(doomed_ws, "train")
        refs = _watch_many(ctx, probe, machine.name, works, tmp_path, poll_s=period)
        refs += _watch_many(ctx, probe, "broken", [("/broken/w", 1)], tmp_path / "b", poll_s=period)
        refs += _watch_many(ctx, probe, doomed.name, [(doomed_work, doomed_pid)], tmp_path / "d", poll_s=period)
        try:
            failed = probe.wait_for(ChildFailed)
            assert "RuntimeError: a bug in the poll" in failed.detail
            assert preempt_machine(sim.dir, doomed.name)
            stalled = probe.wait_for(Stalled)
            assert stalled.failure == Code.PREEMPTED
            at = [_steps(ws, w) for w, _ in works]
            wait_until(lambda: all(_steps(ws, w) >= n + 5 for (w, _), n in zip(works, at, strict=True)), 10,
                       "five more beats for each healthy job")
            assert not refs[3].is_alive()
            assert len(probe.box.of(ChildFailed)) == 1
        finally:
            ctx.workspaces.pop("broken", None)
            for ref in refs:
                ref.stop()


def test_a_progress_line_naming_a_checkpoint_is_told_to_the_parent(
    machines: Machines, probe: ProbeHandle, watch: Any, emitted: Mailbox,
) -> None:
    command = (f"{progress(stage='train', step=1)}; "
               f"{progress(stage='train', step=2, checkpoint='out/ck-2.pt')}")
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, command)
        watch(machine.name, work, pid)
        told = probe.wait_for(Progress)
        assert told.line == {"stage": "train", "step": 2, "checkpoint": "out/ck-2.pt"}
        probe.wait_for(Exited)
        assert len(probe.box.of(Progress)) == 1
        assert [p.line.get("step") for p in emitted.of(Progress)] == [1, 2]


def test_a_job_whose_process_vanished_is_stalled(machines: Machines, probe: ProbeHandle, watch: Any) -> None:
    """Killed from outside (no response.json written): `lost`, which is a stall, not an exit."""
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "sleep 30")
        watch(machine.name, work, pid)
        ctx = machines.ctx
        ctx.reactor.call(ws.stop, work, timeout=30)  # kills the job's whole process group, wrapper included
        stalled = probe.wait_for(Stalled)
        assert stalled.failure == Code.STALLED
        assert "vanished" in stalled.detail


def test_an_unknown_message_fails_the_heartbeat_and_tells_the_parent(
    ctx: Context, probe: ProbeHandle, log_path: Path,
) -> None:
    hb = HeartbeatActor.start(ctx, probe.ref, job="t", seed=1, attempt=0, poll_s=0.1, setup_grace_s=1,
                              stall_after_s=1, lost_after_s=1, timeout_s=1, log_path=log_path)
    try:
        hb.tell(42)
        failed = probe.wait_for(ChildFailed)
        assert failed.child == "heartbeat:t/1/a0"
        assert "TypeError" in failed.detail
        assert hb.actor_stopped.wait(10)
    finally:
        hb.stop()


def test_a_stopped_heartbeat_polls_no_more_and_its_loop_ends(
    machines: Machines, probe: ProbeHandle, watch: Any, ctx: Context,
) -> None:
    """Stopping ends the poll loop at its next beat (no trio cancel for a loop parked on the clock),
    and no poll writes `alive` after the stop."""
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "sleep 30")
        before = ctx.reactor.statistics().tasks_running
        ref = watch(machine.name, work, pid, poll_s=0.1)
        alive = Path(work) / "alive"  # the job's start wrote it; every poll writes it again
        wait_until(lambda: ctx.reactor.statistics().tasks_running == before + 2, 10)  # the loop, the exit hint
        first = alive.stat().st_mtime_ns
        wait_until(lambda: alive.stat().st_mtime_ns != first, 10, "a poll")
        ref.stop()
        wait_until(lambda: ctx.reactor.statistics().tasks_running == before, 5)
        written = alive.stat().st_mtime_ns
        time.sleep(0.5)  # the thing under test: five poll periods in which nothing may happen
        assert alive.stat().st_mtime_ns == written
        assert not probe.box.of(Stalled)


def test_the_attempts_switch_ends_the_poll_loop_before_the_heartbeat_is_stopped(
    machines: Machines, probe: ProbeHandle, watch: Any, ctx: Context,
) -> None:
    """The attempt sets `polls_off` as its release begins: the loop ends at its next beat while the
    actor still lives (its stop comes later: ten thousand of them after the deletes), so a cancel of
    every job does not keep the reactor polling machines that are being deleted."""
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "sleep 30")
        before = ctx.reactor.statistics().tasks_running
        off = Flag()
        ref = watch(machine.name, work, pid, poll_s=0.1, polls_off=off)
        alive = Path(work) / "alive"
        wait_until(lambda: ctx.reactor.statistics().tasks_running == before + 2, 10)  # the loop, the exit hint
        first = alive.stat().st_mtime_ns
        wait_until(lambda: alive.stat().st_mtime_ns != first, 10, "a poll")
        off.set()
        wait_until(lambda: ctx.reactor.statistics().tasks_running == before + 1, 5, "the loop's end")
        assert ref.is_alive()
        written = alive.stat().st_mtime_ns
        ref.stop()  # the exit hint's task is cancelled by the stop, as before
        wait_until(lambda: ctx.reactor.statistics().tasks_running == before, 5)
        assert alive.stat().st_mtime_ns == written
        assert not probe.box.of(Stalled)


def test_the_header_goes_to_log_txt_with_the_first_log_bytes_in_one_write(
    machines: Machines, probe: ProbeHandle, watch: Any, log_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attempt's header opens its part of log.txt in the same write as the job's first log bytes
    (item 59: a write of its own at the start, a system call per attempt in a start burst); a job that
    never prints still gets its header once polled, and it is written once."""
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: Any) -> int:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(log_path):
                writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    header = "--- attempt 0 on local this-computer (now) ---\n"
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "echo line one; sleep 0.3; echo line two")
        # the job has printed before the heartbeat's first poll (on a loaded machine that poll could
        # otherwise come first, and a header with nothing to go with is written alone, as it must be)
        wait_until(lambda: (Path(work) / "log.txt").read_bytes().startswith(b"line one"), 30, "line one")
        ref = watch(machine.name, work, pid, log_header=header)
        probe.wait_for(Exited)
        ref.stop()
    assert log_path.read_text() == header + "line one\nline two\n"
    assert writes[0].startswith(header.encode())
    assert writes[0] != header.encode()  # not alone: the first log bytes came with it
    assert sum(w.count(header.encode()) for w in writes) == 1


def test_a_quiet_job_s_log_still_opens_with_the_header(machines: Machines, watch: Any, log_path: Path) -> None:
    header = "--- attempt 0 on local this-computer (now) ---\n"
    with machines.open() as (machine, ws):
        work, pid = machines.start_job(ws, "sleep 30")
        ref = watch(machine.name, work, pid, log_header=header)
        wait_until(lambda: log_path.exists() and log_path.read_text() == header, 10, "the header, once polled")
        ref.stop()
    assert log_path.read_text() == header
