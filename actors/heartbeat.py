"""HeartbeatActor: feeds the host's watchdog, watches progress, detects exit and stalls.

Each tick (every `poll_s`, a reactor timer) is one round trip: write `alive` on the host, say
whether the job runs, read the new progress lines and the new tail of the log. New log bytes go to
the seed's `log.txt`; progress lines go to the parent as `Progress`. The parent hears `Exited`
once the job ended, or `Stalled(failure)`:

- `stalled`: no progress within the window. The window is `setup_grace_s` from the launch until
  the job reports a stage outside SETUP_STAGES, then `stall_after_s` from its last sign of life
  (a progress line or log output). Both are anchored at the launch, never at a (re)attach.
- `unreachable`: no successful tick for `lost_after_s`; `preempted`: the provider took the machine;
  `job_failed`: the job ran past its own `timeout_s`.
After `Exited`, ticks go on (only the heartbeat) until the actor is stopped: a long fetch must not
look like a lost controller to the host's watchdog.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import outcome
import pykka

from actors.base import Actor, Context
from protocols.failures import CallCancelled, Code, MachineGone, Refused, Unreachable
from protocols.hosts.workspace import PollResult
from protocols.messages import Exited, Message, Progress, Stalled, Watch

SETUP_STAGES = frozenset({"", "setup", "boot", "install", "download", "prepare", "load", "starting"})


class _Tick(Message, frozen=True, kw_only=True):
    pass


class _Polled(Message, frozen=True, kw_only=True):
    result: Any  # outcome.Outcome[PollResult]


class HeartbeatActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: str, seed: int, attempt: int,
                 poll_s: float, setup_grace_s: float, stall_after_s: float, lost_after_s: float,
                 timeout_s: float, log_path: Path) -> None:
        super().__init__(ctx, parent, f"heartbeat:{job}/{seed}/a{attempt}")
        self.head = {"job": job, "seed": seed, "attempt": attempt}
        self.poll_s, self.setup_grace_s, self.stall_after_s = poll_s, setup_grace_s, stall_after_s
        self.lost_after_s, self.timeout_s = lost_after_s, timeout_s
        self.log_path = log_path
        self.watch: Watch | None = None
        self.progress_at = 0
        self.log_at = 0
        self.setup_done = False
        self.last_life = 0.0
        self.last_ok = 0.0
        self.exited = False
        self.stalled = False
        self.last_progress: dict[str, Any] | None = None
        self.ticks = 0

    def handle(self, message: Any) -> Any:
        match message:
            case Watch() as w:
                self.watch = w
                self.last_life = w.launched_at
                self.last_ok = time.time()
                self._tick()
            case _Tick():
                self._tick()
            case _Polled(result=result):
                self._polled(result)
                if not self.stalled:
                    self.later(self.poll_s, _Tick())
            case "last_progress":
                return self.last_progress
            case _:
                raise TypeError(f"HeartbeatActor cannot handle {message!r}")
        return None

    def _tick(self) -> None:
        w = self.watch
        assert w is not None
        ws = self.ctx.workspaces.get(w.machine)
        if ws is None:
            return  # the machine is being released
        self.ticks += 1
        if self.exited:
            self.spawn(ws.beat, w.work, reply=lambda r: _Polled(result=r))
        else:
            self.spawn(ws.poll, w.work, w.pid, self.progress_at, self.log_at, reply=lambda r: _Polled(result=r))

    def _stall(self, code: Code, detail: str) -> None:
        self.stalled = True
        self.tell_parent(Stalled(**self.head, failure=code, detail=detail))

    def _polled(self, result: outcome.Outcome[PollResult | None]) -> None:
        now = time.time()
        w = self.watch
        assert w is not None
        if isinstance(result, outcome.Error):
            exc = result.error
            match exc:
                case MachineGone():
                    self._stall(Code.PREEMPTED, str(exc))
                case Refused(code=code):
                    self._stall(code, str(exc))
                case Unreachable() | OSError():
                    if now - self.last_ok > self.lost_after_s:
                        self._stall(Code.UNREACHABLE, f"no answer for {now - self.last_ok:.0f} s: {exc}")
                case CallCancelled():
                    pass
                case _:
                    raise exc
            return
        self.last_ok = now
        res = result.value
        if res is None or self.exited:
            return
        if w.reattached and self.ticks == 1:
            # written before this controller came: life as of the files' own times, not now
            seen = max(res.progress_mtime, res.log_mtime, w.launched_at)
            self._take_log(res, seen)
            self._take_progress(res, seen)
            self.last_life = seen
        else:
            self._take_log(res, now)
            self._take_progress(res, now)
        if res.state == "exited":
            self.exited = True
            self.tell_parent(Exited(**self.head, exit_code=res.exit_code if res.exit_code is not None else -1))
            return
        if res.state in ("lost", "gone"):
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

    def _take_log(self, res: PollResult, now: float) -> None:
        if res.log:
            self.log_at += len(res.log)
            self.last_life = max(self.last_life, now)
            with open(self.log_path, "ab") as f:
                f.write(res.log)

    def _take_progress(self, res: PollResult, now: float) -> None:
        data = res.progress
        end = data.rfind(b"\n")
        if end < 0:
            return  # no whole line yet: read it again next time
        self.progress_at += end + 1
        for raw in data[: end + 1].splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(line, dict):
                continue
            stage = str(line.get("stage", ""))
            self.last_life = max(self.last_life, now)
            self.last_progress = line
            if stage not in SETUP_STAGES:
                self.setup_done = True
            progress = Progress(**self.head, stage=stage, line=line)
            self.ctx.emit(progress)
            self.tell_parent(progress)
