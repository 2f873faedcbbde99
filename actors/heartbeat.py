"""HeartbeatActor: feeds the host's watchdog, watches progress, detects exit and stalls.

A loop on the reactor (`_Watch.run`) polls every `poll_s`, on the clock every watch of that period
shares (actors/ticks.py), one round trip each: write `alive` on the host, say whether the job
runs, read the new progress lines and the new tail of the log. Where the poll has nothing to wait
on (`PollsNow`: a virtual machine's job, in this process's memory), there is no loop: the clock's
one pass steps every such watch of its period (`_Watch.beat_now`), and trio reschedules and
switches to no task per poll. It tells the actor only what is new (and, when nothing is, often
enough to judge the stall window), so a quiet job costs the actor threads nothing. New log bytes
go to the seed's `log.txt`; progress lines are emitted as `Progress` (and told to the parent when
they name a checkpoint). Where the workspace can tell when the job's process ends (`wait_exit`: a
pidfd on this computer, the virtual job's clock), a poll goes out at once then, so an exit is not
left waiting for the next tick. The parent hears `Exited` once the job ended, or `Stalled(failure)`:

- `stalled`: no progress within the window. The window is `setup_grace_s` from the launch until
  the job reports a stage outside SETUP_STAGES, then `stall_after_s` from its last sign of life
  (a progress line or log output). Both are anchored at the launch, never at a (re)attach.
- `unreachable`: no successful tick for `lost_after_s`; `preempted`: the provider took the machine;
  `job_failed`: the job ran past its own `timeout_s`.
After `Exited`, ticks go on (only the heartbeat) until the actor is stopped: a long fetch must not
look like a lost controller to the host's watchdog.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import msgspec
import outcome
import pykka
import trio

from actor_run.actors.base import Actor, Context
from actor_run.actors.flag import Flag
from actor_run.actors.runtime import Result, Task
from actor_run.actors.ticks import Subscription, Ticker, call_at, subscribe
from actor_run.protocols.failures import CallCancelled, Code, HostError, MachineGone, Refused
from actor_run.protocols.hosts.workspace import PollResult, PollsNow, Workspace
from actor_run.protocols.messages import AttemptHead, Exited, Message, Progress, Stalled, Watch
from actor_run.protocols.specs import job_key
from actor_run.protocols.verdict import REASON_MAX, TAIL_BYTES, oom_line

_decode_line = msgspec.json.Decoder().decode  # a progress line: any JSON value (objects are kept)
SETUP_STAGES = frozenset({"", "setup", "boot", "install", "download", "prepare", "load", "starting"})


class _Polled(Message, frozen=True, kw_only=True):
    """What a poll found that the actor has not heard yet (whole progress lines only)."""

    state: str = "running"  # running | exited | lost | gone
    exit_code: int | None = None
    lines: list[bytes] = msgspec.field(default_factory=list)
    log: bytes = b""
    error: Any = None  # the exception of a failed poll
    first: bool = False
    mtime: float = 0.0
    billed_s: float = -1.0


class _LoopEnded(Message, frozen=True, kw_only=True):
    result: Any  # outcome.Error: a loop failed


def _only_a_failure(result: Result[None]) -> _LoopEnded | None:
    """A watch task's end is news to the actor only if it failed: a hint that came, or a loop
    cancelled because the actor stops, is not (a thousand of each in an end burst)."""
    if isinstance(result, outcome.Error) and not isinstance(result.error, CallCancelled):
        return _LoopEnded(result=result)
    return None


REPORT_S = 2.0  # new progress and log are handed to the actor at most this often (a line naming a
# checkpoint, an exit, an error or the first poll go at once): a UI needs no more, and a job that
# writes a line per poll would otherwise cost a message per poll


_POLLS_NOW: dict[type, bool] = {}  # per workspace class: whether it is a PollsNow (an isinstance of a
# runtime protocol looks at every member: microseconds per attempt in a start burst)


def _polls_now(ws: Workspace) -> bool:
    kind = type(ws)
    known = _POLLS_NOW.get(kind)
    if known is None:
        known = _POLLS_NOW[kind] = isinstance(ws, PollsNow)
    return known


class _Watch:
    """The reactor side of the heartbeat, for one job: `run` polls every `poll_s` (which writes
    `alive`), keeps the read offsets, and tells the actor what is new, at most every `report_s` unless
    it is urgent (or, every `idle_every` quiet polls, that the job still runs, so it can judge its
    stall window); `step_on_exit` polls at once when the workspace says the job ended. Two reactor
    tasks (not a nursery: cancelling one of those cost three times a task's cancel), on the reactor
    thread only; one where the workspace knows the moment of the end in advance (`exit_at`: the
    loop wakes then) or cannot tell it at all (the polls see it); none where the workspace polls at
    once (`PollsNow`): `beat_now` is called in the shared clock's pass, `_at_exit` from the heap of
    alarms at the known end, and a poll that must wait after all is `step` on a task of its own.
    After the job exited, only the heartbeat goes on."""

    def __init__(self, ws: Workspace, work: str, pid: int, idle_every: int, tell: Callable[[Message], None],
                 report_s: float, off: Flag | None = None) -> None:
        self.ws, self.work, self.pid = ws, work, pid
        self.off = off  # set by the attempt once it ends (its machine is being deleted): no more steps
        self.idle_every, self.tell, self.report_s = idle_every, tell, report_s
        self.progress_at = self.log_at = 0
        self.state, self.quiet, self.first = "running", 0, True
        self.lines = bytearray()  # whole progress lines not yet told
        self.log = bytearray()
        self.mtime = 0.0
        self.last_told = 0.0  # trio's clock, once the first step has told (it always does)
        self.busy = False  # a step is in flight (the loop's, or the exit hint's)
        self.again = False  # the exit hint came during a step: take another at once
        self.stopped = False  # the actor stopped: the loop ends at its next beat, taking no step
        self.exit_at: float | None = None  # trio's clock: the job's end, known in advance (the loop wakes then)
        # a workspace that polls at once (`PollsNow`): no loop; stepped in the shared clock's pass
        self.now_ws: PollsNow | None = None
        self.spawn_step: Callable[[], object] | None = None  # `step` on a task: a poll that must wait
        self.poll_s = 0.0

    async def step(self) -> None:
        """One poll (or, after the exit, one beat); tell the actor what is new if it is due."""
        self.busy = True
        try:
            if self.state == "running":
                res = await self.ws.poll(self.work, self.pid, self.progress_at, self.log_at)
            else:
                await self.ws.beat(self.work)
                res = None
        except (HostError, OSError) as exc:
            self.tell(_Polled(state=self.state, error=exc))
            self.quiet = 0
            return
        finally:
            self.busy = False
        if res is not None:
            self._take(res)

    def _take(self, res: PollResult, now: float | None = None) -> None:
        """Once per poll of every watched job (20,000 a second at N=10,000 in bench/load.py): whole
        lines are gathered as bytes and split only when told, and no object the collector tracks is
        made unless the actor is told."""
        progress, log = res.progress, res.log
        end = progress.rfind(b"\n") + 1  # a line still being written is read next time
        if end:
            self.progress_at += end
            self.lines += progress[:end]
        if log:
            self.log_at += len(log)
            self.log += log
        if res.progress_mtime > self.mtime or res.log_mtime > self.mtime:
            self.mtime = max(self.mtime, res.progress_mtime, res.log_mtime)
        self.quiet += 1
        if now is None:
            now = trio.current_time()
        # a checkpoint's line: "checkpoint" holds no newline, so it is in the new lines iff in one of them
        urgent = self.first or res.state != self.state or progress.find(b"checkpoint", 0, end) >= 0
        due = (self.lines or self.log) and now - self.last_told >= self.report_s
        if urgent or due or self.quiet >= self.idle_every:
            self.tell(_Polled(state=res.state, exit_code=res.exit_code, lines=bytes(self.lines).splitlines(),
                              log=bytes(self.log), first=self.first, mtime=self.mtime, billed_s=res.billed_s))
            self.lines, self.log = bytearray(), bytearray()
            self.quiet, self.first, self.last_told = 0, False, now
        self.state = res.state

    def ended(self) -> bool:
        """No step more: the actor stopped, or the attempt switched the polls off (it is ending)."""
        return self.stopped or (self.off is not None and self.off.is_set())

    # --- a workspace that polls at once: stepped in the shared clock's one pass, no task ------------

    def start_now(self, sub: Subscription, poll_s: float) -> None:
        """On the reactor thread: the first step at once, then one at every beat of the shared clock of
        `poll_s` (`sub`, whose beat is `beat_now`): one pass over every watch of that period, where a
        loop each was a task trio rescheduled and switched to at every poll."""
        self.poll_s = poll_s
        if not sub.cancelled and self.beat_now():
            subscribe(poll_s, sub)

    def beat_now(self) -> bool:
        """A beat (on the reactor thread): one step, unless one is in flight on a task (it counts as
        this beat's). False, and the clock drops this watch, once stopped, switched off, or failed: an
        error other than the host's is the actor's failure (as a loop's was), and no other watch's."""
        if self.ended():
            return False
        try:
            now = trio.current_time()
            if not self.busy:
                self.again = False  # a hint during a step in flight: this step is the one it asked for
                self.step_now(now)
            if self.exit_at is not None:
                self._near_exit(now)
        except Exception as exc:
            self._failed(exc)
            return False
        return True

    def step_now(self, now: float) -> None:
        """One poll (or, after the exit, one beat) at once; tell the actor what is new if it is due.
        A poll that needs a wait (`poll_now` says None) is taken by `step` on a task."""
        ws = self.now_ws
        assert ws is not None
        try:
            if self.state == "running":
                res = ws.poll_now(self.work, self.pid, self.progress_at, self.log_at)
            else:
                res = None
                if ws.beat_now(self.work):
                    return
        except (HostError, OSError) as exc:
            self.tell(_Polled(state=self.state, error=exc))
            self.quiet = 0
            return
        if res is not None:
            self._take(res, now)
            return
        assert self.spawn_step is not None
        self.busy = True  # until the task's step ends: the beats take no step meanwhile
        self.spawn_step()

    def _near_exit(self, now: float) -> None:
        """The job's known end comes before the next beat: a step then, from the heap of alarms."""
        at = self.exit_at
        if at is not None and self.state == "running" and at < now + self.poll_s:
            self.exit_at = None  # once: the step at the end decides what happened
            call_at(at, self._at_exit)

    def _at_exit(self) -> None:
        if self.ended() or self.busy or self.state != "running":
            return
        try:
            self.step_now(trio.current_time())
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self.stopped = True
        self.tell(_LoopEnded(result=outcome.Error(exc)))

    async def step_on_exit(self) -> None:
        """Take a step as soon as the workspace says the job may have ended, not at the next tick
        (the exit is then seen within milliseconds; the poll still decides what happened)."""
        try:
            await self.ws.wait_exit(self.work, self.pid)
        except (HostError, OSError):
            return  # the ticks' polls find out what is wrong
        if self.ended():
            return
        if self.busy:
            self.again = True
        elif self.state == "running":
            if self.now_ws is not None:
                self.step_now(trio.current_time())
            else:
                await self.step()

    async def run(self, poll_s: float) -> None:
        """Poll every `poll_s` (which writes `alive`) on the shared clock of that period, until cancelled
        or `stopped`."""
        ticker = Ticker(poll_s)  # a wait on the shared clock that makes nothing but trio's trap
        while not self.ended():
            if not self.busy:  # busy: the exit hint's step is in flight, and counts as this tick's
                await self.step()
                while self.again:  # the hint came during that step
                    self.again = False
                    if self.state == "running":
                        await self.step()
            at = self.exit_at
            if at is not None and self.state == "running" and at < trio.current_time() + poll_s:
                self.exit_at = None  # once: the step at the end decides what happened
                await ticker.wait_until(at)  # the end comes before the next beat: a step then
            else:
                await ticker.wait()  # one shared clock per period, not a sleep per job


class HeartbeatActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: str, seed: int, attempt: int,
                 poll_s: float, setup_grace_s: float, stall_after_s: float, lost_after_s: float,
                 timeout_s: float, log_path: Path, log_header: str = "", log_from: int = 0,
                 polls_off: Flag | None = None) -> None:
        super().__init__(ctx, parent, f"heartbeat:{job}/{seed}/a{attempt}")
        self.head: AttemptHead = {"job": job, "seed": seed, "attempt": attempt}
        self.poll_s, self.setup_grace_s, self.stall_after_s = poll_s, setup_grace_s, stall_after_s
        self.lost_after_s, self.timeout_s = lost_after_s, timeout_s
        self.log_path = log_path
        self.watch: Watch | None = None
        self.setup_done = False
        self.last_life = 0.0
        self.last_ok = 0.0
        self.exited = False
        self.stalled = False
        # the job's own verdict, for its exit (protocols/verdict.py): its flags and the end of its log
        self.retriable = False
        self.reason = ""
        self.oom_flag = ""
        self.tail = b""
        self._watch: _Watch | None = None  # the reactor side, once watching
        self._loop: Task | None = None  # its poll loop
        self._log_fd: int | None = None  # log.txt, append-only, open for the attempt
        self._log_lock = threading.Lock()  # the ledger's writer thread may write too (a shared ledger's fence)
        self._log_closed = False
        # written first: with the first poll's log bytes, in one write (a write of its own at the start
        # was a system call per attempt in a start burst: item 59), or alone at the stop
        self._log_header = log_header.encode()
        self.log_from = log_from  # bytes of the job's log already in log.txt (an adopted attempt goes on there)
        self.key = job_key(job, seed)
        # the attempt's switch: once set, the poll loop takes no more steps (its beat ends it), before
        # this actor's stop gets its turn. The attempt sets it as it ends: its machine is being
        # deleted, so a poll can only find it going, and the host's watchdog has nothing to keep alive.
        # Ten thousand jobs cancelled at once kept polling (20,000 polls a second on the reactor)
        # until each heartbeat's stop came round, and every delete waited behind them (item 36).
        self.polls_off = polls_off
        # judge the stall window at least four times per window, even when nothing is new
        self.idle_every = max(1, int(min(setup_grace_s, stall_after_s, lost_after_s) / 4 / poll_s))

    def handle(self, message: Any) -> Any:
        match message:
            case Watch() as w:
                self.watch = w
                self.last_life = w.launched_at
                self.last_ok = time.time()
                ws = self.ctx.workspaces.get(w.machine)
                if ws is not None:
                    ref = self.actor_ref

                    def tell(msg: Message) -> None:
                        with contextlib.suppress(pykka.ActorDeadError):
                            ref.tell(msg)

                    watch = self._watch = _Watch(ws, w.work, w.pid, self.idle_every, tell, REPORT_S, self.polls_off)
                    watch.log_at = self.log_from
                    # the exit hint: a task waiting for it only where nothing else can tell (about 25
                    # objects the collector walks per job: issue 30's census)
                    exit_at = ws.exit_at(w.work, w.pid)
                    if exit_at is not None and exit_at < math.inf:
                        watch.exit_at = exit_at
                    if _polls_now(ws):
                        # stepped in the shared clock's pass (a subscription, cancelled with the tasks)
                        watch.now_ws = cast(PollsNow, ws)
                        watch.spawn_step = functools.partial(self.spawn, watch.step, reply=_only_a_failure)
                        sub = Subscription(watch.beat_now)
                        self._tasks.add(sub)
                        self.ctx.reactor.soon(functools.partial(watch.start_now, sub, self.poll_s))
                    else:
                        self._loop = self.spawn(watch.run, self.poll_s, reply=_only_a_failure)
                    if exit_at is None:
                        self.spawn(watch.step_on_exit, reply=_only_a_failure)
            case _Polled() as polled:
                if not self.stalled:
                    self._polled(polled)
            case _LoopEnded(result=result):
                raise result.error
            case _:
                raise TypeError(f"HeartbeatActor cannot handle {message!r}")
        return None

    def cancel_tasks(self) -> None:
        """The poll loop, parked on the shared clock between polls, is told to end at its next beat
        without a step: a trio cancel cost the reactor tens of microseconds per job in an end burst.
        A loop in the middle of a poll is cancelled."""
        watch, loop = self._watch, self._loop
        if watch is not None and watch.now_ws is not None:
            watch.stopped = True  # no step after this (its subscription is cancelled below too)
        elif watch is not None and loop is not None and not loop.done:
            watch.stopped = True  # before `busy` is read: a step that starts after this is the last
            if not watch.busy:
                self._tasks.discard(loop)
        super().cancel_tasks()

    def _stall(self, code: Code, detail: str, taken_at: float | None = None) -> None:
        self.stalled = True
        self.cancel_tasks()
        self.tell_parent(Stalled(**self.head, failure=code, detail=detail, taken_at=taken_at))

    def _polled(self, p: _Polled) -> None:
        now = time.time()
        w = self.watch
        assert w is not None
        if p.error is not None:
            exc = p.error
            match exc:
                case MachineGone(at=at):
                    self._stall(Code.PREEMPTED, str(exc), taken_at=at)
                case Refused(code=code):
                    self._stall(code, str(exc))
                case _:
                    if now - self.last_ok > self.lost_after_s:
                        self._stall(Code.UNREACHABLE, f"no answer for {now - self.last_ok:.0f} s: {exc}")
            return
        self.last_ok = now
        if self.exited:
            return
        # after a reattach, what the first poll reads was written before: life as of the files' times
        seen = max(p.mtime, w.launched_at) if (w.reattached and p.first) else now
        self._take_log(p.log, seen)
        self._take_progress(p.lines, seen)
        if p.state == "exited":
            self.exited = True
            exit_code = p.exit_code if p.exit_code is not None else -1
            oom = (self.oom_flag or oom_line(self.tail, exit_code)) if exit_code != 0 else ""
            self.tell_parent(Exited(**self.head, exit_code=exit_code, billed_s=p.billed_s, retriable=self.retriable,
                                    reason=self.reason, oom=oom))
            return
        if p.state in ("lost", "gone"):
            self._stall(Code.STALLED, "the job's process vanished without an exit code")
            return
        if now - w.launched_at > self.timeout_s:
            self._stall(Code.JOB_FAILED, f"the job ran past its timeout_s ({self.timeout_s:.0f} s)")
            return
        window = self.stall_after_s if self.setup_done else self.setup_grace_s
        anchor = self.last_life if self.setup_done else w.launched_at
        if now - anchor > window:
            what = "progress" if self.setup_done else "a stage past setup"
            self._stall(Code.STALLED, f"no {what} for {now - anchor:.0f} s (window {window:.0f} s)")

    def _take_log(self, log: bytes, seen: float) -> None:
        """The job's new log bytes to log.txt; the first report writes the attempt's header with them
        (or alone: a quiet job's log still opens with it once the first poll is in)."""
        if log:
            self.last_life = max(self.last_life, seen)
            self.tail = (self.tail + log)[-TAIL_BYTES:] if len(log) < TAIL_BYTES else log[-TAIL_BYTES:]
        if log or self._log_header:
            self._write_log(log)

    def _write_log(self, data: bytes) -> None:
        """Through the ledger's fence: at once without a shared ledger; on one, once the claim on
        the job is proven, never after it is lost (a worker past its lease writes no log bytes)."""
        self.ctx.ledger.write_file(self.key, functools.partial(self._append, data))

    def _append(self, data: bytes) -> None:
        """On this actor's thread, or on the ledger's writer thread (a shared ledger's fence). The
        header not yet written goes first, in the same write."""
        with self._log_lock:
            if self._log_header:
                data, self._log_header = self._log_header + data, b""
            if not data:
                return
            if self._log_closed:  # written after the attempt's stop: one open for it
                fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    while data:
                        data = data[os.write(fd, data):]
                finally:
                    os.close(fd)
                return
            if self._log_fd is None:  # opened once: a poll's new bytes cost one write, not an open
                self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
                os.fchmod(self._log_fd, 0o600)  # private whatever the umask: a job's output may hold its secrets
            while data:  # a plain descriptor: no buffered file object to build per attempt or flush per write
                data = data[os.write(self._log_fd, data):]

    def _close_log(self) -> None:
        if self._log_header:  # no poll was ever reported: the header alone
            self._write_log(b"")
        with self._log_lock:
            fd, self._log_fd = self._log_fd, None
            self._log_closed = True
        if fd is not None:
            os.close(fd)

    def on_stop(self) -> None:
        """After stop(): the poll loop is cancelled and the log file closed."""
        super().on_stop()
        self._close_log()

    def on_failure(self, exception_type: type[BaseException] | None, exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        """After a raise: as on_stop, then the parent hears ChildFailed."""
        self._close_log()
        super().on_failure(exception_type, exception_value, traceback)

    def _take_progress(self, lines: list[bytes], seen: float) -> None:
        """Each line an event (a job that writes one per poll: 20,000 a second at N=10,000)."""
        head, emit = self.head, self.ctx.emit
        job, seed, attempt = head["job"], head["seed"], head["attempt"]
        for raw in lines:
            try:
                line = _decode_line(raw)
            except msgspec.DecodeError:
                try:  # what Python's json writes and msgspec refuses: NaN, Infinity (a diverged loss)
                    line = json.loads(raw)
                except ValueError:
                    continue
            if not isinstance(line, dict):
                continue
            stage = line.get("stage", "")
            if type(stage) is not str:
                stage = str(stage)
            if seen > self.last_life:
                self.last_life = seen
            if not self.setup_done and stage not in SETUP_STAGES:
                self.setup_done = True
            if "retriable" in line or "oom" in line:
                self._verdict(line)
            progress = Progress(job=job, seed=seed, attempt=attempt, stage=stage, line=line)
            emit(progress)
            if "checkpoint" in line:
                self.tell_parent(progress)  # the attempt brings the checkpoint home

    def _verdict(self, line: dict[str, Any]) -> None:
        """A progress line with the job's own verdict: `{"retriable": true, "reason": "..."}` or
        `{"oom": true}` (the last line of each kind counts; it matters only if the job exits non-zero)."""
        reason = line.get("reason", "")
        reason = (reason if isinstance(reason, str) else json.dumps(reason))[:REASON_MAX]
        if "retriable" in line:
            self.retriable = line["retriable"] is True
            self.reason = reason if self.retriable else ""
        if "oom" in line:
            self.oom_flag = f"the job flagged oom{': ' + reason if reason else ''}" if line["oom"] is True else ""
