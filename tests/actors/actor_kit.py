"""What the actor tests share that is not a fixture: a Mailbox and `wait_for`, the probe actor,
real machines to point an actor at, and bounded polling of external conditions.

Nothing here sleeps to wait for our own code: `Mailbox.wait_for` blocks on a queue that the probe
(or `ctx.emit`) feeds. `wait_until` polls only what another process does (a folder, a process).
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pykka
from support.waits import poll

from actor_run.actors import Context
from actor_run.actors.pool import live_actors
from actor_run.protocols.clouds.sim import SimSettings
from actor_run.protocols.hosts.workspace import Launch, PollResult, Workspace
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.names import encode_name

M = TypeVar("M")

LOCAL = Offer(cloud="local", region="this-computer")
SIM = Offer(cloud="sim", region="us-east", gpu="A100", hourly_usd=1.8)


def fast_sim(**fates: Any) -> SimSettings:
    """Sim settings with almost no latency, and the given failure rates."""
    return SimSettings(launch_latency_s=0.01, delete_latency_s=0.0, **fates)


def _any(message: Any) -> bool:
    return True


class Mailbox:
    """Messages put by other threads, taken in order; `wait_for` keeps the ones it skips, so a later
    `wait_for` of another type still finds them."""

    def __init__(self) -> None:
        self.q: queue.Queue[Any] = queue.Queue()
        self.seen: list[Any] = []  # every message taken from the queue, in arrival order
        self._backlog: list[Any] = []

    def put(self, message: Any) -> None:
        self.q.put(message)

    def wait_for(self, kind: type[M], timeout: float = 10.0, where: Callable[[M], bool] = _any) -> M:
        for i, m in enumerate(self._backlog):
            if isinstance(m, kind) and where(m):
                del self._backlog[i]
                return m
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            try:
                m = self.q.get(timeout=max(0.0, left))
            except queue.Empty:
                names = [type(x).__name__ for x in self.seen]
                raise AssertionError(f"no {kind.__name__} within {timeout} s; seen: {names}") from None
            self.seen.append(m)
            if isinstance(m, kind) and where(m):
                return m
            self._backlog.append(m)

    def _pull(self) -> None:
        while True:
            try:
                m = self.q.get_nowait()
            except queue.Empty:
                return
            self.seen.append(m)
            self._backlog.append(m)

    def of(self, kind: type[M]) -> list[M]:
        """Every message of `kind` received so far, taken by `wait_for` or not."""
        self._pull()
        return [m for m in self.seen if isinstance(m, kind)]


def wait_for(box: Mailbox, kind: type[M], timeout: float = 10.0, where: Callable[[M], bool] = _any) -> M:
    return box.wait_for(kind, timeout, where)


class Probe(pykka.ThreadingActor):
    """A parent that records every message it is told on a Mailbox."""

    use_daemon_thread = True

    def __init__(self, box: Mailbox) -> None:
        super().__init__()
        self.box = box

    def on_receive(self, message: Any) -> Any:
        self.box.put(message)
        return None


class ProbeHandle:
    def __init__(self, ref: pykka.ActorRef[Any], box: Mailbox) -> None:
        self.ref = ref
        self.box = box

    def wait_for(self, kind: type[M], timeout: float = 10.0, where: Callable[[M], bool] = _any) -> M:
        return self.box.wait_for(kind, timeout, where)


def machine_name(ctx: Context, attempt: int = 0, job: str = "t", seed: int = 1) -> str:
    return encode_name(job, seed, attempt, ctx.owner, time.time() + 3600)


class Machines:
    """Real machines for actors that expect one leased already (transfer, heartbeat)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._n = 0

    @contextlib.contextmanager
    def open(self, offer: Offer = LOCAL) -> Iterator[tuple[Machine, Workspace]]:
        """Launch and connect a machine, register its workspace in ctx.workspaces; on exit close the
        workspace and delete the machine."""
        ctx = self.ctx
        cloud = ctx.clouds[offer.cloud]
        name = machine_name(ctx, attempt=100 + self._n)
        self._n += 1
        machine = ctx.reactor.call(cloud.launch, offer, name, time.time() + 3600, timeout=30)
        try:
            ws = ctx.reactor.call(cloud.connect, machine, timeout=30)
            ctx.workspaces[name] = ws
            try:
                yield machine, ws
            finally:
                ctx.workspaces.pop(name, None)
                ctx.reactor.call(ws.aclose, timeout=30)
        finally:
            ctx.reactor.call(cloud.delete, name, machine.id, timeout=30)

    def start_job(self, ws: Workspace, command: str, *, attempt: int = 0,
                  lost_after_s: float = 60.0) -> tuple[str, int]:
        """Start `command` detached in a fresh work folder (cwd: its out/); its work folder and pid."""
        work = ws.work_dir("t", 1, attempt)
        launch = Launch(work=work, command=command, code=None, inputs=[], env={}, lost_after_s=lost_after_s)
        pid = self.ctx.reactor.call(ws.start, launch, timeout=30)
        return work, pid

    def wait_exited(self, ws: Workspace, work: str, pid: int, timeout: float = 10.0) -> PollResult:
        """Poll the host (an external process) until the job has exited; bounded."""
        def exited() -> PollResult | None:
            res: PollResult = self.ctx.reactor.call(ws.poll, work, pid, 0, 0, timeout=30)
            return res if res.state != "running" else None

        return poll(exited, timeout, f"the job in {work} to exit")


def wait_until(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Bounded polling of an external condition (a process gone, a folder removed)."""
    return poll(check, timeout, what, every=0.02)


def others() -> list[pykka.ActorRef[Any]]:
    """Every running actor but the probes: the pooled ones (actors/pool.py `live_actors`) and a
    test's own pykka actors."""
    return [r for r in [*live_actors(), *pykka.ActorRegistry.get_all()] if not issubclass(r.actor_class, Probe)]


def wait_actors_stopped(timeout: float = 10.0) -> list[str]:
    """Wait on each running actor's stopped event; the names of those still running after."""
    for ref in others():
        ref.actor_stopped.wait(timeout)
    return [r.actor_class.__name__ for r in others()]
