"""HeartbeatActor: feeds the host's watchdog, watches progress, detects exit and stalls.

Its reactor side is `JobWatch` (actors/watch.py): it polls the job's machine every `poll_s` (which
writes `alive` for the host's watchdog), reads the new progress lines and log bytes, and tells this
actor only what is new (and, when nothing is, often enough to judge the stall window), so a quiet
job costs the actor threads nothing. Here, on the actor's thread: new log bytes go to the seed's
`log.txt`; progress lines are emitted as `Progress` (and told to the parent when they name a
checkpoint), and the job's own verdict is read from them (`{"retriable": true}`, `{"oom": true}`)
and from its log's last bytes (protocols/verdict.py). The parent hears `Exited` once the job
ended (with that verdict), or `Stalled(failure)`:

- `stalled`: no progress within the window. The window is `setup_grace_s` from the launch until
  the job reports a stage outside SETUP_STAGES, then `stall_after_s` from its last sign of life
  (a progress line or log output). Both are anchored at the launch, never at a (re)attach.
- `unreachable`: no successful tick for `lost_after_s`; `preempted`: the provider took the machine;
  `job_failed`: the job ran past its own `timeout_s`; `deadline`: the machine's deadline came. Both
  are reactor timers set at `Watch` (`_Due`), so they end the job within moments of passing,
  whatever the poll interval (the polls check them too).
After `Exited`, ticks go on (only the heartbeat) until the actor is stopped: a long fetch must not
look like a lost controller to the host's watchdog.
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import msgspec
import pykka

from actor_run.actors.base import Actor, Context
from actor_run.actors.flag import Flag
from actor_run.actors.runtime import Task
from actor_run.actors.ticks import Subscription
from actor_run.actors.watch import HELD, REPORT_S, JobWatch, LoopEnded, Polled, only_a_failure, polls_now
from actor_run.protocols.failures import Code, MachineGone, Refused
from actor_run.protocols.hosts.workspace import PollsNow
from actor_run.protocols.messages import AttemptHead, Exited, Message, Progress, Stalled, Watch
from actor_run.protocols.specs import job_key
from actor_run.protocols.verdict import REASON_MAX, TAIL_BYTES, oom_line

_decode_line = msgspec.json.Decoder().decode  # a progress line: any JSON value (objects are kept)
SETUP_STAGES = frozenset({"", "setup", "boot", "install", "download", "prepare", "load", "starting"})


class _Due(Message, frozen=True, kw_only=True):
    """A deadline's timer fired (a reactor timer, not a poll: a quiet job's polls tell the actor only
    now and then): `timeout` (the job's `timeout_s` from its launch) or `deadline` (the machine's)."""

    what: str



class HeartbeatActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: str, seed: int, attempt: int,
                 poll_s: float, setup_grace_s: float, stall_after_s: float, lost_after_s: float,
                 timeout_s: float, log_path: Path, log_header: str = "", log_from: int = 0,
                 polls_off: Flag | None = None, deadline: float = math.inf, log_max_bytes: int = 64_000_000) -> None:
        super().__init__(ctx, parent, f"heartbeat:{job}/{seed}/a{attempt}")
        self.head: AttemptHead = {"job": job, "seed": seed, "attempt": attempt}
        self.poll_s, self.setup_grace_s, self.stall_after_s = poll_s, setup_grace_s, stall_after_s
        self.lost_after_s, self.timeout_s = lost_after_s, timeout_s
        self.deadline = deadline  # unix time: the machine's own deadline (it is deleted then, job or not)
        self.log_max_bytes = log_max_bytes
        self.log_cut = 0  # bytes of the job's log cut from log.txt (its middle, past log_max_bytes)
        self.dropped = 0  # progress lines never emitted (more than a report holds)
        self._acked = 0  # bytes of output handled here (HELD)
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
        self._watch: JobWatch | None = None  # the reactor side, once watching
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
                # one timer, for the earlier (a few objects per job the collector walks: issue 30's census)
                timeout_at = w.launched_at + self.timeout_s
                self._arm(*((timeout_at, "timeout") if timeout_at <= self.deadline else (self.deadline, "deadline")))
                ws = self.ctx.workspaces.get(w.machine)
                if ws is not None:
                    ref = self.actor_ref

                    def tell(msg: Message) -> None:
                        try:
                            ref.tell(msg)
                        except pykka.ActorDeadError:
                            if isinstance(msg, Polled):
                                HELD.add(-msg.held)

                    watch = self._watch = JobWatch(ws, w.work, w.pid, self.idle_every, tell, REPORT_S, self.polls_off,
                                                 log_cap=self.log_max_bytes)
                    watch.log_at = self.log_from
                    # the exit hint: a task waiting for it only where nothing else can tell (about 25
                    # objects the collector walks per job: issue 30's census)
                    exit_at = ws.exit_at(w.work, w.pid)
                    if exit_at is not None and exit_at < math.inf:
                        watch.exit_at = exit_at
                    if polls_now(ws):
                        # stepped in the shared clock's pass (a subscription, cancelled with the tasks)
                        watch.now_ws = cast(PollsNow, ws)
                        watch.spawn_step = functools.partial(self.spawn, watch.step, reply=only_a_failure)
                        sub = Subscription(watch.beat_now)
                        self._tasks.add(sub)
                        self.ctx.reactor.soon(functools.partial(watch.start_now, sub, self.poll_s))
                    else:
                        self._loop = self.spawn(watch.run, self.poll_s, reply=only_a_failure)
                    if exit_at is None:
                        self.spawn(watch.step_on_exit, reply=only_a_failure)
            case Polled() as polled:
                if polled.held:
                    HELD.add(-polled.held)
                    self._acked += polled.held
                if not self.stalled:
                    self._polled(polled)
            case _Due(what=what):
                if not (self.stalled or self.exited):
                    self._overdue(what)
            case LoopEnded(result=result):
                raise result.error
            case _:
                raise TypeError(f"HeartbeatActor cannot handle {message!r}")
        return None

    def _arm(self, at: float, what: str) -> None:
        """A timer that tells `_Due(what)` at `at` (unix time), so the deadline ends the job on time
        whatever the poll interval; none for a moment beyond any run (a year away)."""
        delay = at - time.time()
        if delay < 365 * 86400.0:  # also false for nan and inf
            self.later(max(0.0, delay), _Due(what=what))

    def _overdue(self, what: str) -> None:
        if what == "timeout":
            self._stall(Code.JOB_FAILED, f"the job ran past its timeout_s ({self.timeout_s:.0f} s)")
        else:
            self._stall(Code.DEADLINE, "the machine's deadline came before the job ended")

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
        self.tell_parent(Stalled(**self.head, failure=code, detail=detail, taken_at=taken_at,
                                 progress_dropped=self.dropped))

    def _release_held(self) -> None:
        """At the stop: what was told and never handled (still in the inbox) no longer counts."""
        watch = self._watch
        if watch is not None and watch.told > self._acked:
            HELD.add(self._acked - watch.told)
            self._acked = watch.told

    def _polled(self, p: Polled) -> None:
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
        self.log_cut, self.dropped = p.cut, p.dropped
        # after a reattach, what the first poll reads was written before: life as of the files' times
        seen = max(p.mtime, w.launched_at) if (w.reattached and p.first) else now
        if p.grew:  # the log grows on the machine past the part read as it comes: the job lives
            self.last_life = max(self.last_life, seen)
        self._take_log(p.log, seen)
        self._take_progress(p.lines, seen)
        if p.state == "exited":
            self.exited = True
            exit_code = p.exit_code if p.exit_code is not None else -1
            oom = (self.oom_flag or oom_line(self.tail, exit_code)) if exit_code != 0 else ""
            self.tell_parent(Exited(**self.head, exit_code=exit_code, billed_s=p.billed_s, retriable=self.retriable,
                                    reason=self.reason, oom=oom, log_cut=self.log_cut,
                                    progress_dropped=self.dropped))
            return
        if p.state in ("lost", "gone"):
            self._stall(Code.STALLED, "the job's process vanished without an exit code")
            return
        if now - w.launched_at > self.timeout_s:
            self._overdue("timeout")
            return
        if now > self.deadline:
            self._overdue("deadline")
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
        self._release_held()
        self._close_log()

    def on_failure(self, exception_type: type[BaseException] | None, exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        """After a raise: as on_stop, then the parent hears ChildFailed."""
        self._release_held()
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
