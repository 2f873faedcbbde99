"""AttemptActor: conducts one attempt: lease -> upload -> start -> watch -> fetch -> release.

Children, started in this order and stopped in the reverse: LeaseActor; on `Leased`,
CostMeterActor and TransferActor, each told its first message (`StartMeter`, `Upload`) as it starts,
so both are handled in the child's first turn; once the job started, HeartbeatActor, told `Watch`
the same way (it opens log.txt with the attempt's header). Each is started when its first message
is known: a child started earlier waited a turn of its own for it (bench/RESULTS.md, item 55).
Every step is a message; nothing here waits on the network.

The end (`_finish`) is the same for every outcome: silence the heartbeat's polls and the meter's
live figures (one flag they share), stop the transfer, tell the lease `Release` (deleting the
machine ends the job on it; a Release is urgent: actors/pool.py), and on `Released` stop the
heartbeat and the meter, tell the parent `AttemptEnded(outcome, failure, usage, phases)`, then stop. A raise here
(`on_failure`) stops the children, which deletes the machine (the lease's stop hook), and still
tells the parent, with `internal`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import outcome
import pykka

from actor_run.actors.base import Actor, Context, error_text, failure_text
from actor_run.actors.durable import wait_durable
from actor_run.actors.flag import Flag
from actor_run.actors.heartbeat import HeartbeatActor
from actor_run.actors.lease import LeaseActor
from actor_run.actors.meter import CostMeterActor, usage_between
from actor_run.actors.reattach import Reattach, taken_over
from actor_run.actors.runtime import Result
from actor_run.actors.transfer import TransferActor
from actor_run.protocols.attempt_time import AttemptTime
from actor_run.protocols.clouds.gpus import gpu_class, gpu_count
from actor_run.protocols.failures import Code, MachineGone
from actor_run.protocols.files import append_private
from actor_run.protocols.hosts.workspace import Launch
from actor_run.protocols.messages import (
    Acquire,
    Adopt,
    AttemptEnded,
    AttemptHead,
    AttemptStarted,
    Cancel,
    ChildFailed,
    Exited,
    Fetch,
    FetchCheckpoint,
    Fetched,
    JobStarted,
    Leased,
    LeaseFailed,
    Machine,
    Message,
    Offer,
    Progress,
    Release,
    Released,
    Stalled,
    StartMeter,
    StopMeter,
    TransferFailed,
    Upload,
    Uploaded,
    Usage,
    Watch,
)
from actor_run.protocols.names import encode_name
from actor_run.protocols.specs import Job
from actor_run.protocols.verdict import judge


class _Started(Message, frozen=True, kw_only=True):
    result: Any  # Result[int]


class _Probed(Message, frozen=True, kw_only=True):
    result: Any  # Result[tuple[str, int, float]]: the work folder, the pid (0: never started), its start


def _billed_from(machine: Machine) -> float:
    """When the provider started billing the machine: its creation (never in our future)."""
    now = time.time()
    return min(machine.created_at, now) if machine.created_at > 0 else now


class AttemptActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: Job, attempt: int, offer: Offer,
                 timebox: AttemptTime, seed_dir: Path, resume_dir: Path | None = None,
                 reattach: Reattach | None = None, seed_dir_clean: bool = False,
                 reserved_usd: float | None = None, checkpoint_asked: Flag | None = None) -> None:
        super().__init__(ctx, parent, f"attempt:{job.name}/{job.seed}/a{attempt}")
        self.job, self.attempt, self.offer = job, attempt, offer
        self.head: AttemptHead = {"job": job.name, "seed": job.seed, "attempt": attempt}
        self.timebox = timebox  # its setup grace and its machine's deadline (protocols/attempt_time.py)
        self.seed_dir = seed_dir
        # the parent made seed_dir and nothing was fetched into it yet: the fetch has nothing to replace
        self.seed_dir_clean = seed_dir_clean
        self.began = time.time()
        self.deadline = timebox.deadline(self.began)
        self.resume_dir = resume_dir
        self.reattach = reattach
        self.reserved_usd = reserved_usd  # the meter's guard stops the attempt before its spend crosses it
        self.checkpoints: set[str] = set()
        # the job's, set before a checkpoint is asked for: its end looks for .checkpoint only then
        self.checkpoint_asked = checkpoint_asked
        if reattach is not None:
            self.deadline = reattach.machine.deadline
            self.name = reattach.machine.name
        else:
            ctx.at("names", job.key)
            self.name = encode_name(job.name, job.seed, attempt, ctx.owner, self.deadline)
        self.children: list[pykka.ActorRef[Any]] = []
        self.meter: pykka.ActorRef[Any] | None = None  # these two start on Leased, the heartbeat with the job
        self.transfer: pykka.ActorRef[Any] | None = None
        self.heartbeat: pykka.ActorRef[Any] | None = None
        self.machine: Machine | None = None
        self.metered_from = 0.0  # when the meter's clock started (StartMeter)
        self.taken_at: float | None = None  # the provider took the machine away (preempted): its bill stopped
        self.leased = False  # Leased came: a machine that answered (a made one that did not is still billed)
        self._ended = False  # AttemptEnded told: the machine is gone
        self.work: str | None = None
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.exited: Exited | None = None  # what the heartbeat saw at the job's end (the job's verdict)
        self.billed_s = -1.0  # a run billed by the second: its seconds, as the provider reported them
        self.phases: dict[str, float] = {}
        self._mark = self.began
        self.finishing: tuple[str, Code | None, str] | None = None
        self.reason = ""  # the job's own words on its failure (AttemptEnded.reason)
        # set at the release (the machine is being deleted): the heartbeat's polls stop at their next
        # beat and the meter says no live figure more, before either's stop has its turn (a Release
        # is urgent: actors/pool.py; their stops are not)
        self._ending = Flag()
        self._releasing = False
        self._early_release: Released | None = None

    # --- hooks ---------------------------------------------------------------------------------

    def on_start(self) -> None:
        """Actor thread, before the first message: start the lease, ask for a machine. The other
        children start when their first message is known (`_start_meter_and_transfer` on `Leased`,
        `_start_heartbeat` once the job started)."""
        if not self.seed_dir_clean:
            self.seed_dir.mkdir(parents=True, exist_ok=True)
        self.lease = LeaseActor.start(self.ctx, self.actor_ref, **self.head,
                                      launch_timeout_s=self.timebox.setup_grace_s)
        self.children.append(self.lease)
        self.ctx.emit(AttemptStarted(**self.head, offer=self.offer))
        if self.reattach is not None:
            self.lease.tell(Adopt(machine=self.reattach.machine))
        else:
            index = self.offer.candidate
            cache = self.job.candidates[index].cache if 0 <= index < len(self.job.candidates) else None
            self.lease.tell(Acquire(offer=self.offer, name=self.name, deadline=self.deadline, cache=cache))

    def _header(self) -> str:
        """The line that opens this attempt's part of log.txt: its run and number, place and start."""
        run = self.ctx.ledger.run_of(self.job.key)
        return (f"--- {f'run {run} ' if run else ''}attempt {self.attempt} on {self.offer.cloud} {self.offer.region} "
                f"{self.offer.gpu}".rstrip()
                + f" ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.began))}) ---\n")

    def _start_meter_and_transfer(self, start: StartMeter) -> pykka.ActorRef[Any]:
        """On `Leased`: the meter, told `start` at once (its first turn handles both), and the transfer
        (returned: the caller tells it its first ask, which its first turn handles too)."""
        ctx, parent = self.ctx, self.actor_ref
        self.meter = CostMeterActor.start(ctx, parent, **self.head, ending=self._ending)
        self.children.append(self.meter)
        self.meter.tell(start)
        self.transfer = TransferActor.start(ctx, parent, job=self.job, attempt=self.attempt)
        self.children.append(self.transfer)
        return self.transfer

    def _start_heartbeat(self, watch: Watch) -> None:
        """Once the job runs (or, adopted, on `Leased`): the heartbeat, which opens log.txt with the
        header as it starts, then watches the job (`watch`, handled in the same first turn)."""
        p, ctx, parent = self.job.policy, self.ctx, self.actor_ref
        header, log_from = self._header(), 0
        if self.reattach is not None:  # an adopted attempt goes on in its part of log.txt, if this one has it
            header, log_from = taken_over(self.seed_dir / "log.txt", self.attempt, self.ctx.owner, header)
        self.heartbeat = HeartbeatActor.start(
            ctx, parent, **self.head, poll_s=p.poll_s, setup_grace_s=self.timebox.setup_grace_s,
            stall_after_s=p.stall_after_s, lost_after_s=p.lost_after_s, timeout_s=self.job.timeout_s,
            log_path=self.seed_dir / "log.txt", log_header=header, log_from=log_from, polls_off=self._ending,
            deadline=self.deadline, log_max_bytes=int(p.log_max_mb * 1e6),
        )
        self.children.append(self.heartbeat)
        self.heartbeat.tell(watch)

    def _phase(self, name: str) -> None:
        now = time.time()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self._mark, 3)
        self._mark = now

    # --- the lifecycle -------------------------------------------------------------------------

    def handle(self, message: Any) -> Any:
        if self._ended:  # AttemptEnded is told (a message its own stop did not answer)
            return None
        match message:
            case Leased(machine=machine) as event:
                self.machine, self.leased = machine, True
                self._phase("lease")
                self.ctx.emit(event)
                # the provider bills from the machine's creation, not from when it answered
                self.metered_from = _billed_from(machine)
                if self.finishing is not None:  # ended while the create was out: the release deletes it
                    return None
                transfer = self._start_meter_and_transfer(
                    StartMeter(machine=machine, at=self.metered_from, reserved_usd=self.reserved_usd))
                if self.reattach is not None and not self.reattach.work:
                    # the earlier controller died between the upload and the record of its start:
                    # the machine says whether the job runs (then it is watched) or never started
                    self._probe_start(machine)
                    return None
                if self.reattach is not None:
                    # the job runs already: watch it, anchored at its launch
                    r = self.reattach
                    self.work, self.pid = r.work, r.pid
                    self._mark = min(self._mark, r.launched_at)  # its run phase: the whole run, not the adopter's
                    if r.handle:
                        self.ctx.workspaces[machine.name].attach(r.work, r.handle)
                    self._start_heartbeat(Watch(machine=machine.name, work=r.work, pid=r.pid,
                                                launched_at=r.launched_at, reattached=True))
                    return None
                resume = str(self.resume_dir) if self.resume_dir is not None else None
                transfer.tell(Upload(machine=machine.name, resume_dir=resume))
            case LeaseFailed(failure=failure, detail=detail, machine=made, taken_at=taken_at) as event:
                if made is not None:  # it was made and never answered: it bills until the release deletes it
                    self.machine, self.metered_from = made, _billed_from(made)
                    self.taken_at = taken_at
                self._phase("lease")
                self.ctx.emit(event)
                self._finish("failed", failure, detail)
            case Uploaded() as event:
                self._phase("upload")
                self.ctx.emit(event)
                if self.finishing is None:
                    self._start_job(event)
            case TransferFailed(failure=failure, detail=detail, taken_at=taken_at) as event:
                if failure is Code.PREEMPTED:
                    self.taken_at = taken_at if taken_at is not None else event.t
                self.ctx.emit(event)
                self._finish("failed", failure, detail)
            case _Started(result=result):
                self._started(result)
            case _Probed(result=result):
                self._probed(result)
            case Progress(line=line):
                self._maybe_checkpoint(line)
            case Exited(exit_code=code, billed_s=billed_s) as event:
                self._phase("run")
                self.exit_code, self.exited = code, event
                self.billed_s = billed_s
                self.ctx.emit(event)
                if self.finishing is None and self.machine is not None and self.work is not None:
                    assert self.transfer is not None  # started on Leased, before any job could start
                    self.transfer.tell(Fetch(machine=self.machine.name, work=self.work, into=str(self.seed_dir),
                                             replace=not self.seed_dir_clean))
            case Fetched() as event:
                self._phase("fetch")
                self.ctx.emit(event)
                e = self.exited
                assert e is not None
                assert self.exit_code is not None
                verdict, why = judge(self.exit_code, retry_on_exit=self.job.policy.retry_on_exit,
                                        retriable=e.retriable, reason=e.reason, oom=e.oom)
                if verdict is None:
                    self._finish("succeeded", None, "")
                else:
                    self.reason = e.oom if verdict is Code.OOM else e.reason if verdict is Code.RETRIABLE else ""
                    self._finish("failed", verdict, why)
            case Stalled(failure=failure, detail=detail, taken_at=taken_at) as event:
                if failure is Code.PREEMPTED:
                    self.taken_at = taken_at if taken_at is not None else event.t
                self.ctx.emit(event)
                self._finish("failed", failure, detail)
            case Cancel(failure=failure, detail=detail):
                self._finish("failed", failure, detail or "canceled")
            case ChildFailed(child=child, detail=detail):
                self._finish("failed", Code.INTERNAL, f"{child} failed: {detail}")
            case Released() as event:
                if self.finishing is None or not self._releasing:
                    self._early_release = event  # the lease ended on its own (it failed): ChildFailed follows
                else:
                    self._released(event)
            case _:
                raise TypeError(f"AttemptActor cannot handle {message!r}")
        return None

    def _maybe_checkpoint(self, line: dict[str, Any]) -> None:
        """A progress line that names a checkpoint under out/: bring it here now, while the machine
        lives (a preemption gives no warning), for the next attempt's in/resume."""
        path = line.get("checkpoint")
        if not isinstance(path, str) or path in self.checkpoints or self.machine is None or self.work is None:
            return
        if not path.startswith("out/"):
            path = "out/" + path.lstrip("/")
        self.checkpoints.add(path)
        if self.checkpoint_asked is not None:
            self.checkpoint_asked.set()
        assert self.transfer is not None  # started on Leased
        self.transfer.tell(FetchCheckpoint(machine=self.machine.name, work=self.work, path=path, line=line,
                                           into=str(self.seed_dir / ".checkpoint")))

    def _start_job(self, up: Uploaded) -> None:
        assert self.machine is not None
        ws = self.ctx.workspaces[self.machine.name]
        self.work = ws.work_dir(self.job.name, self.job.seed, self.attempt)
        env = {**self.job.env, "ACTOR_RUN_SEED": str(self.job.seed), "ACTOR_RUN_ATTEMPT": str(self.attempt),
               # the class and how many the machine has (`A100:8`: A100 and 8); CUDA_VISIBLE_DEVICES is
               # the provider's, untouched
               "ACTOR_RUN_GPU": gpu_class(self.offer.gpu),
               "ACTOR_RUN_GPUS": str(gpu_count(self.offer.gpu)) if self.offer.gpu else "0"}
        if self.machine.cache:  # the candidate's cache volume, attached (a cold start leaves it unset)
            env["ACTOR_RUN_CACHE"] = self.machine.cache
        launch = Launch(
            work=self.work, command=self.job.command.replace("{seed}", str(self.job.seed)), code=up.code,
            inputs=up.inputs, env=env, lost_after_s=self.job.policy.lost_after_s, resume=up.resume,
            # json.dumps of the dict, written out: only the name needs quoting
            request=(f'{{"job": {json.dumps(self.job.name)}, "seed": {self.job.seed}, '
                     f'"attempt": {self.attempt}}}').encode(),
        )
        ledger, name, work, soon = self.ctx.ledger, self.machine.name, self.work, self.ctx.reactor.soon

        async def record(handle: str) -> None:
            """On the reactor, before a submit returns: a run the provider names by a handle (a
            queue job) is followed by it after a crash (resume), so it is durable first."""
            await wait_durable(ledger.queue_handle(name, work, handle, time.time()), soon, "the queue job's handle")

        self.spawn(ws.start, launch, record, reply=lambda r: _Started(result=r))

    def _probe_start(self, machine: Machine) -> None:
        """Ask the adopted machine whether this attempt's job was started there (answer: `_Probed`)."""
        ws = self.ctx.workspaces[machine.name]
        work = ws.work_dir(self.job.name, self.job.seed, self.attempt)

        async def probe() -> tuple[str, int, float]:
            pid, at = await ws.started(work)
            return work, pid, at

        self.spawn(probe, reply=lambda r: _Probed(result=r))

    def _probed(self, result: Result[tuple[str, int, float]]) -> None:
        """The job runs (watched as any reattached job, and recorded so that a next resume knows it),
        or it never started (started now, on this machine: uploads are idempotent)."""
        if self.finishing is not None:
            return
        assert self.machine is not None
        if isinstance(result, outcome.Error):
            self._finish("failed", Code.UNREACHABLE, f"resume: could not ask the machine about its job: {result.error}")
            return
        work, pid, at = result.value
        if pid <= 0:
            self.reattach = None  # nothing to take over: this attempt starts the job
            assert self.transfer is not None
            self.transfer.tell(Upload(machine=self.machine.name,
                                      resume_dir=str(self.resume_dir) if self.resume_dir is not None else None))
            return
        launched_at = at if 0 < at <= time.time() else time.time()
        self.work, self.pid = work, pid
        self._mark = min(self._mark, launched_at)
        self.ctx.ledger.record_started(self.machine.name, work, pid, launched_at)
        self._start_heartbeat(Watch(machine=self.machine.name, work=work, pid=pid, launched_at=launched_at,
                                    reattached=True))

    def _started(self, result: Result[int]) -> None:
        if isinstance(result, outcome.Error):
            exc = result.error
            if isinstance(exc, MachineGone):
                # taken away between the upload and the start: a preemption like any other (retried),
                # and its bill stopped when the provider took it, not at our delete
                self.taken_at = exc.at if exc.at is not None else time.time()
                self._finish("failed", Code.PREEMPTED, f"start: {exc}")
                return
            code = getattr(exc, "code", Code.LAUNCH_FAILED)
            self._finish("failed", code if isinstance(code, Code) else Code.LAUNCH_FAILED, f"start: {exc}")
            return
        self.pid = result.value
        launched_at = time.time()
        self._phase("start")
        self.ctx.emit(JobStarted(**self.head, pid=self.pid))
        assert self.machine is not None
        assert self.work is not None
        self.ctx.ledger.record_started(self.machine.name, self.work, self.pid, launched_at)
        self._start_heartbeat(Watch(machine=self.machine.name, work=self.work, pid=self.pid, launched_at=launched_at))

    # --- the end -------------------------------------------------------------------------------

    def _finish(self, outcome_: str, failure: Code | None, detail: str) -> None:
        """Every end goes the same way: straight to the release. Deleting the machine ends the job
        on it (a cloud's VM goes, the local and sim sandboxes' processes are killed, an SSH host's
        delete stops our job there), so no separate stop round trip stands before it."""
        if self.finishing is not None:
            return
        self.finishing = (outcome_, failure, detail)
        self.cancel_tasks()  # a start still on its way: deleting the machine ends that job too
        self._release()

    def _release(self) -> None:
        if self._releasing:
            return
        self._releasing = True
        # the heartbeat's polls and the meter's live figures stop now: the charge ends when the
        # delete goes out, and no live figure may pass it. Their stops (each a trio cancel on the
        # reactor: the exit hint's wait, the budget guard's timer) come with `Released`, after the
        # delete: ten thousand of them before it held the deletes back on the reactor (item 40)
        self._ending.set()
        if self.transfer is not None:
            self.stop_soon(self.transfer)  # its stop hook cancels a transfer in flight; the lease goes on
        if self.taken_at is not None and self.machine is not None:
            # before the release: the ledger has when its bill stopped before it has the machine gone
            self.ctx.ledger.record_taken(self.machine.name, self.taken_at)
        if self._early_release is not None:
            self._released(self._early_release)
            return
        # dead: it failed and is deleting the machine in its on_failure; its Released comes next
        with contextlib.suppress(pykka.ActorDeadError):
            self.lease.tell(Release())

    def _released(self, event: Released) -> None:
        self._phase("release")
        # the meter's own arithmetic, here: asking it would hold a pool thread per ending attempt
        # a preempted machine stops billing when the provider takes it (we heard of it a poll later
        # at most), not when the delete that follows is confirmed
        end = event.t if self.taken_at is None or not event.confirmed else min(event.t, self.taken_at)
        usage = (usage_between(self.machine, self.metered_from, end, confirmed=event.confirmed,
                               billed_s=self.billed_s)
                 if self.machine is not None else Usage())
        assert self.finishing is not None
        outcome_, failure, detail = self.finishing
        for child in (self.heartbeat, self.meter):  # silenced since the release began (`_ending`)
            if child is not None:
                self.stop_soon(child)
        if self.heartbeat is None:  # the job never started: the attempt's part of log.txt is its header
            # and, without a machine, why (a started job's heartbeat wrote the header as it started)
            line = "" if self.leased else f"no machine: {failure or outcome_}: {detail}\n"
            self.ctx.ledger.write_file(self.job.key, functools.partial(append_private, self.seed_dir / "log.txt",
                                                                       (self._header() + line).encode()))
        if not event.confirmed:
            unconfirmed = f"machine {event.machine} not confirmed deleted: {event.detail}"
            detail = (detail + "; " if detail else "") + unconfirmed
        self.tell_parent(AttemptEnded(**self.head, outcome=outcome_, failure=failure, detail=detail, usage=usage,
                                      phases=dict(self.phases), offer=self.offer, exit_code=self.exit_code,
                                      reason=self.reason))
        self._ended = True
        self.stop_now()  # told, and the machine is gone: what is left of this actor is bookkeeping

    def on_failure(self, exception_type: type[BaseException] | None, exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        """After a raise here: stop the children in reverse order (the lease deletes the machine
        before its stop returns), then tell the parent the attempt ended `internal`, with what the
        machine cost up to now."""
        self.cancel_tasks()
        # the traceback to the run's log file only (`traceback` bound): the terminal shows the job's end
        self.log.bind(traceback=True).error("{} failed:\n{}", self.label,
                                             failure_text(exception_type, exception_value, traceback))
        usage = Usage()
        meter = self.meter
        for child in reversed(self.children):
            if child is meter and meter is not None and meter.is_alive():
                with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
                    usage = meter.ask(StopMeter(at=time.time(), confirmed=True), timeout=30, block=True)
            try:
                child.stop(block=True, timeout=self.ctx.delete_timeout_s + 60)
            except (pykka.Timeout, pykka.ActorDeadError):
                self.log.error("{} did not stop in time", child)
        self.tell_parent(AttemptEnded(**self.head, outcome="failed", failure=Code.INTERNAL, usage=usage,
                                      detail=error_text(exception_type, exception_value),
                                      phases=dict(self.phases), offer=self.offer))

    def on_stop(self) -> None:
        """Actor thread, after stop(): stop whatever children are left, in reverse start order,
        waiting for each, unless the attempt ended: then the machine is gone and the children are
        stopping already, and a thousand attempts ending at once would hold a thread each."""
        self.cancel_tasks()
        for child in reversed(self.children):
            if self._ended:
                if child.is_alive():  # most stopped already (their stops came with the release)
                    self.stop_soon(child)
            elif child.is_alive():
                try:
                    child.stop(block=True, timeout=self.ctx.delete_timeout_s + 60)
                except pykka.Timeout:
                    self.log.error("{} did not stop in time", child)
