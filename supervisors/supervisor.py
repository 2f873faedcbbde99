"""An OTP-style supervisor (supervisor.erl is the reference), for pykka actors.

- Start order: children start in the order of their specs; `stop_children` stops them in the
  REVERSE order, each waited for before the next (a lease's stop deletes its machine).
- Strategies: `one_for_one` restarts only the child that exited; `one_for_all` stops all the others
  (reverse order) and restarts all (start order); `rest_for_one` stops and restarts the children
  started after it, and it.
- Restart types: `permanent` is always restarted; `transient` only after an abnormal exit (a
  `ChildFailed`); `temporary` never.
- Intensity: more than `intensity` restarts within `period_s` seconds and the supervisor gives up:
  it stops every child and reports `GaveUp` to its own parent. Defaults: 3 in 5 s (OTP's are 1 in 5).
  `restart_allowed` is the rule, as a pure function.

Children are told who their parent is at start (`start(parent_ref)`) and must tell it
`ChildFailed(child=name)` when they fail; a normal exit is reported with `ChildExited`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pykka
from loguru import logger

from actor_run.actors.pool import PooledActor
from actor_run.protocols.messages import ChildFailed, Message


class Strategy(enum.StrEnum):
    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"


class Restart(enum.StrEnum):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    TEMPORARY = "temporary"


class ChildExited(Message, frozen=True, kw_only=True):
    """A child stopped normally."""

    child: str


class GaveUp(Message, frozen=True, kw_only=True):
    """A supervisor exceeded its restart intensity and stopped."""

    supervisor: str
    detail: str


class ChildSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    start: Callable[[pykka.ActorRef[Any]], pykka.ActorRef[Any]]  # given the supervisor's ref
    restart: Restart = Restart.PERMANENT
    shutdown_s: float = 30.0


def restart_allowed(
    history: Sequence[float], now: float, *, intensity: int, period_s: float,
) -> tuple[bool, list[float]]:
    """OTP's rule: one more restart at `now` is allowed unless it makes more than `intensity`
    restarts within the last `period_s` seconds. Returns the decision and the pruned history
    including `now` (when allowed)."""
    recent = [t for t in history if now - t <= period_s]  # OTP keeps a restart exactly period_s old
    recent.append(now)
    return len(recent) <= intensity, recent


def should_restart(restart: Restart, *, abnormal: bool) -> bool:
    return restart is Restart.PERMANENT or (restart is Restart.TRANSIENT and abnormal)


class Supervisor(PooledActor):
    """Starts its children in order, restarts them by type and strategy, stops them in reverse."""

    def __init__(self, name: str, specs: Sequence[ChildSpec], *, strategy: Strategy = Strategy.ONE_FOR_ONE,
                 intensity: int = 3, period_s: float = 5.0, parent: pykka.ActorRef[Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.name = name
        self.specs = list(specs)
        self.strategy = strategy
        self.intensity, self.period_s = intensity, period_s
        self.parent = parent
        self.clock = clock
        self.children: dict[str, pykka.ActorRef[Any]] = {}
        self.restarts: list[float] = []
        self.gave_up = False

    def on_start(self) -> None:
        for spec in self.specs:
            self._start_child(spec)

    def _start_child(self, spec: ChildSpec) -> None:
        self.children[spec.name] = spec.start(self.actor_ref)

    def _stop_child(self, spec: ChildSpec) -> None:
        ref = self.children.pop(spec.name, None)
        if ref is not None and ref.is_alive():
            try:
                ref.stop(block=True, timeout=spec.shutdown_s)
            except pykka.Timeout:
                logger.error("{}: child {} did not stop within {} s", self.name, spec.name, spec.shutdown_s)

    def stop_children(self) -> None:
        """Stop every child, in reverse start order, each waited for."""
        for spec in reversed(self.specs):
            self._stop_child(spec)

    def on_stop(self) -> None:
        """Supervisor thread, after stop(): stop the children in reverse start order."""
        self.stop_children()

    def on_receive(self, message: Any) -> Any:
        match message:
            case ChildFailed(child=child, detail=detail):
                self.child_exited(child, abnormal=True, detail=detail)
            case ChildExited(child=child):
                self.child_exited(child, abnormal=False, detail="")
            case "children":
                return list(self.children)
            case _:
                return self.handle(message)
        return None

    def handle(self, message: Any) -> Any:
        raise TypeError(f"{self.name} cannot handle {message!r}")

    def child_exited(self, child: str, *, abnormal: bool, detail: str) -> None:
        spec = next((s for s in self.specs if s.name == child), None)
        if spec is None or self.gave_up:
            return
        self.children.pop(child, None)
        if not should_restart(spec.restart, abnormal=abnormal):
            if spec.restart is Restart.TEMPORARY:
                self.specs.remove(spec)
            return
        allowed, self.restarts = restart_allowed(self.restarts, self.clock(), intensity=self.intensity,
                                                 period_s=self.period_s)
        if not allowed:
            self.gave_up = True
            self.stop_children()
            if self.parent is not None:
                self.parent.tell(GaveUp(supervisor=self.name,
                                        detail=f"more than {self.intensity} restarts in {self.period_s} s;"
                                               f" last: {child} {detail}"))
            self.stop()
            return
        index = self.specs.index(spec)
        affected = {
            Strategy.ONE_FOR_ONE: [spec],
            Strategy.ONE_FOR_ALL: self.specs,
            Strategy.REST_FOR_ONE: self.specs[index:],
        }[self.strategy]
        for s in reversed(affected):
            if s is not spec:
                self._stop_child(s)
        for s in affected:
            self._start_child(s)
