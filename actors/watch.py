"""The heartbeat's reactor side (actors/heartbeat.py has the actor): `JobWatch` polls one job's
machine, keeps the read offsets of its progress file and log, and tells the actor what is new
(`Polled`), bounded in what it holds (`HELD`, the process-wide count of output told and not yet
handled). Runs on the reactor thread only; its `tell` is the actor's inbox.

How it polls: a loop on the reactor (`JobWatch.run`) every `poll_s`, on the clock every watch of
that period shares (actors/ticks.py), one round trip each: write `alive` on the host, say whether the
job runs, read the new progress lines and the new tail of the log. Where the poll has nothing to
wait on (`PollsNow`: a virtual machine's job, in this process's memory), there is no loop: the
clock's one pass steps every such watch of its period (`JobWatch.beat_now`). Where the workspace
can tell when the job's process ends (`wait_exit`), a poll goes out at once then. After the exit
the rest of the log is read up to the cap (its head and tail, the middle cut with a mark).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import msgspec
import outcome
import trio

from actor_run.actors.flag import Flag
from actor_run.actors.runtime import Result
from actor_run.actors.ticks import Subscription, Ticker, call_at, subscribe
from actor_run.protocols.failures import CallCancelled, HostError
from actor_run.protocols.hosts.workspace import MAX_LOG_PER_POLL, MAX_PROGRESS_PER_POLL, PollResult, PollsNow, Workspace
from actor_run.protocols.messages import Message


class Polled(Message, frozen=True, kw_only=True):
    """What a poll found that the actor has not heard yet (whole progress lines only)."""

    state: str = "running"  # running | exited | lost | gone
    exit_code: int | None = None
    lines: list[bytes] = msgspec.field(default_factory=list)
    log: bytes = b""
    error: Any = None  # the exception of a failed poll
    first: bool = False
    mtime: float = 0.0
    billed_s: float = -1.0
    grew: bool = False  # the log grew on the machine (past the part read as it comes): a sign of life
    cut: int = 0  # bytes of the log not read so far (the middle of a log longer than its cap)
    dropped: int = 0  # progress lines not told so far (more than a report holds)
    held: int = 0  # bytes of output this message holds (HELD's count)


class LoopEnded(Message, frozen=True, kw_only=True):
    """A watch task failed (a bug, or an error other than the host's): the actor raises it."""

    result: Any  # outcome.Error: a loop failed


def only_a_failure(result: Result[None]) -> LoopEnded | None:
    """A watch task's end is news to the actor only if it failed: a hint that came, or a loop
    cancelled because the actor stops, is not (a thousand of each in an end burst)."""
    if isinstance(result, outcome.Error) and not isinstance(result.error, CallCancelled):
        return LoopEnded(result=result)
    return None


PROGRESS_KEEP = 32 << 10  # bytes of the newest progress lines a report holds (lines naming a checkpoint
# aside): a job that floods its progress file has its older lines dropped, counted, never held
LOG_HELD_MAX = 1 << 20  # log bytes held for the actor: told at once past this
HELD_TOTAL_MAX = 64 << 20  # told and not yet handled, all jobs: past this, polls read no log (it waits on the machine)
SKIP_LINE_MAX = 64 << 10  # a cut log's tail starts at a line's start if one begins this near


class Held:
    """Bytes of job output told to heartbeat actors and not yet handled, for the whole process (any
    thread): past HELD_TOTAL_MAX the polls read no more log until the actors catch up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    def over(self) -> bool:
        return self.bytes > HELD_TOTAL_MAX


HELD = Held()


REPORT_S = 2.0  # new progress and log are handed to the actor at most this often (a line naming a
# checkpoint, an exit, an error or the first poll go at once): a UI needs no more, and a job that
# writes a line per poll would otherwise cost a message per poll


_POLLS_NOW: dict[type, bool] = {}  # per workspace class: whether it is a PollsNow (an isinstance of a
# runtime protocol looks at every member: microseconds per attempt in a start burst)


def polls_now(ws: Workspace) -> bool:
    """Whether `ws` polls at once (`PollsNow`): its watch is stepped in the shared clock's pass."""
    kind = type(ws)
    known = _POLLS_NOW.get(kind)
    if known is None:
        known = _POLLS_NOW[kind] = isinstance(ws, PollsNow)
    return known


class JobWatch:
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
                 report_s: float, off: Flag | None = None, log_cap: int = 64_000_000) -> None:
        self.ws, self.work, self.pid = ws, work, pid
        self.off = off  # set by the attempt once it ends (its machine is being deleted): no more steps
        self.idle_every, self.tell, self.report_s = idle_every, tell, report_s
        self.progress_at = self.log_at = 0
        self.state, self.quiet, self.first = "running", 0, True
        self.lines = bytearray()  # whole progress lines not yet told
        self.log = bytearray()
        # the log's cap: its head is read as it comes, its tail after the exit, the middle cut
        self.log_cap, self.log_head = log_cap, log_cap // 2
        self.log_total = 0  # the log's whole size on the machine, as last read (a workspace that says it)
        self.grew = False  # the log grew since the last report
        self.cut_from: int | None = None  # the cut's start (machine offset), its mark not yet written
        self.skip_line = False  # the tail starts at the next line's start
        self.log_nl = True  # the last log bytes taken ended a line
        self.cut = 0  # bytes of the log cut so far
        self.dropped = 0  # progress lines dropped so far
        self.told = 0  # bytes of output told to the actor (HELD; the actor counts what it handled)
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
                room = self.log_room()
                res = await self.ws.poll(self.work, self.pid, self.progress_at, self.log_at, room)
                # the job ended: the rest of its log (up to the cap: the tail) is read before the exit is told
                while res.state == "exited" and 0 <= self.log_at + len(res.log) < res.log_total:
                    self._take(msgspec.structs.replace(res, state=self.state), drain=True)
                    room = self.log_room(res.log_total)  # first: it may move log_at to the tail's start
                    res = await self.ws.poll(self.work, self.pid, self.progress_at, self.log_at, room)
                    if not res.log:
                        break  # nothing more to read (the file shrank): the exit is told
            else:
                await self.ws.beat(self.work)
                res = None
        except (HostError, OSError) as exc:
            self.tell(Polled(state=self.state, error=exc))
            self.quiet = 0
            return
        finally:
            self.busy = False
        if res is not None:
            self._take(res)

    def log_room(self, total: int | None = None) -> int:
        """How much of the log the next poll reads. While the job runs (`total` None): its head, up to
        half the cap, and nothing while the process holds too much output already (HELD: it waits
        on the machine). After the exit (`total`: the log's whole size): the rest, if it fits in the
        cap; else the head is read up to its half of the cap, then the cut is decided here (once) and
        the read jumps to the tail's start."""
        if total is None:
            return 0 if HELD.over() else max(0, min(MAX_LOG_PER_POLL, self.log_head - self.log_at))
        rest = total - self.log_at
        if self.cut_from is None and not self.cut and rest > max(0, self.log_head - self.log_at) + (
                self.log_cap - self.log_head):
            if self.log_at < self.log_head:  # the head first, up to its half of the cap
                return min(MAX_LOG_PER_POLL, self.log_head - self.log_at)
            self.cut_from = self.log_at
            self.log_at = total - (self.log_cap - self.log_head)
            self.skip_line = True
        return max(0, min(MAX_LOG_PER_POLL, total - self.log_at))

    def _cut_mark(self, upto: int) -> bytes:
        """The line that stands where the middle of the log was cut."""
        assert self.cut_from is not None
        n = upto - self.cut_from
        self.cut += n
        mark = (f"[actor-run] {n} bytes of this log were cut here (bytes {self.cut_from}-{upto} of "
                f"{self.log_total}; log_max_mb = {self.log_cap / 1e6:g} keeps the head and the tail): the whole "
                f"log stayed on the machine at {self.work}/log.txt, which is deleted with the machine\n")
        self.cut_from = None
        return (b"" if self.log_nl else b"\n") + mark.encode()

    def _trim_lines(self) -> None:
        """Keep the newest progress lines (about PROGRESS_KEEP bytes) and every line naming a
        checkpoint; count the others as dropped."""
        buf = bytes(self.lines)
        cut = buf.rfind(b"\n", 0, len(buf) - PROGRESS_KEEP) + 1
        if cut <= 0:
            return
        older = buf[:cut]
        n = older.count(b"\n")
        keep = b""
        if b"checkpoint" in older:
            kept = [line for line in older.split(b"\n") if b"checkpoint" in line]
            keep = b"\n".join(kept) + b"\n"
            n -= len(kept)
        self.dropped += n
        self.lines = bytearray(keep + buf[cut:])

    def _take(self, res: PollResult, now: float | None = None, drain: bool = False) -> None:
        """Once per poll of every watched job (20,000 a second at N=10,000 in bench/load.py): whole
        lines are gathered as bytes and split only when told, and no object the collector tracks is
        made unless the actor is told. What is held for the actor is bounded: the newest progress
        lines (PROGRESS_KEEP), the log until LOG_HELD_MAX (then told at once); `drain`: a part of the
        log read after the exit, told at once."""
        progress, log = res.progress, res.log
        end = progress.rfind(b"\n") + 1  # a line still being written is read next time
        if end:
            self.progress_at += end
            self.lines += progress[:end]
            if len(self.lines) > PROGRESS_KEEP:
                self._trim_lines()
        elif len(progress) >= MAX_PROGRESS_PER_POLL:  # one line longer than a poll reads: dropped
            self.progress_at += len(progress)
            self.dropped += 1
        if res.log_total > self.log_total:
            self.log_total, self.grew = res.log_total, True
        if log:
            self.log_at += len(log)
            if self.skip_line:  # the tail's first bytes: from the next line's start
                self.skip_line = False
                nl = log.find(b"\n", 0, SKIP_LINE_MAX)
                if 0 <= nl < len(log) - 1:
                    log = log[nl + 1:]
            if self.cut_from is not None:
                self.log += self._cut_mark(self.log_at - len(log))
            self.log += log
            self.log_nl = log.endswith(b"\n")
        if res.progress_mtime > self.mtime or res.log_mtime > self.mtime:
            self.mtime = max(self.mtime, res.progress_mtime, res.log_mtime)
        self.quiet += 1
        if now is None:
            now = trio.current_time()
        # a checkpoint's line: "checkpoint" holds no newline, so it is in the new lines iff in one of them
        urgent = self.first or res.state != self.state or progress.find(b"checkpoint", 0, end) >= 0
        due = (self.lines or self.log) and now - self.last_told >= self.report_s
        if urgent or due or drain or len(self.log) >= LOG_HELD_MAX or self.quiet >= self.idle_every:
            n = len(self.lines) + len(self.log)
            self.told += n
            HELD.add(n)
            self.tell(Polled(state=res.state, exit_code=res.exit_code, lines=bytes(self.lines).splitlines(),
                              log=bytes(self.log), first=self.first, mtime=self.mtime, billed_s=res.billed_s,
                              grew=self.grew, cut=self.cut, dropped=self.dropped, held=n))
            self.lines, self.log, self.grew = bytearray(), bytearray(), False
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
            self.tell(Polled(state=self.state, error=exc))
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
        self.tell(LoopEnded(result=outcome.Error(exc)))

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


__all__ = ["HELD", "REPORT_S", "JobWatch", "LoopEnded", "Polled", "only_a_failure", "polls_now"]
