"""What every actor stands on: the context it shares with its tree, and `Actor`, a pykka actor
(pool.py: turns on a shared pool of threads) that waits only through the reactor.

Hooks (pykka's rules, restated):
- `on_start` runs in the actor's first turn, before its first message; a raise stops the actor
  and calls `on_failure`.
- `on_receive` handles one `tell`ed message at a time, in the actor's turn on a pool worker; a
  raise calls `on_failure` and stops the actor (`on_stop` is NOT called then).
- `on_stop` runs in a turn after `stop()`; `on_failure` after a raise. Anything that must always
  happen at the end (the lease deleting its machine) belongs in both.
`Actor.on_failure` cancels the actor's reactor tasks and tells its parent `ChildFailed`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import traceback as traceback_module
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import outcome
import pykka
from pykka.messages import _ActorStop

from actor_run.actors.flag import Flag
from actor_run.actors.pool import PooledActor, stop_if_idle
from actor_run.actors.runtime import Reactor, Result, Task
from actor_run.actors.ticks import Subscription, subscribe
from actor_run.protocols.clouds import Cloud
from actor_run.protocols.failures import Code
from actor_run.protocols.hosts.workspace import Workspace
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import ChildFailed, Event, Machine, Message, Offer


def error_text(exception_type: type[BaseException] | None, exception_value: BaseException | None) -> str:
    """One line for a failure: `TypeName: message`."""
    return f"{exception_type.__name__ if exception_type else 'error'}: {exception_value}"


def failure_text(exception_type: type[BaseException] | None, exception_value: BaseException | None,
                 tb: TracebackType | None) -> str:
    """A traceback without the values of local variables (loguru's `diagnose` would print them,
    and a job's environment may hold a secret)."""
    return "".join(traceback_module.format_exception(exception_type, exception_value, tb)).rstrip()


def label_context(label: str) -> dict[str, str]:
    """The job and attempt an actor's label names, for its log lines: labels are `<kind>:<job>/<seed>`
    (a job's actors) or `<kind>:<job>/<seed>/a<attempt>` (an attempt's)."""
    _, _, path = label.partition(":")
    parts = path.split("/")
    if len(parts) < 2:
        return {}
    found = {"job": f"{parts[0]}/seed-{parts[1]}"}
    if len(parts) > 2:
        found["attempt"] = parts[2]
    return found


class Pending(Protocol):
    """A queued ledger write."""

    def when_done(self, fn: Callable[[BaseException | None], None]) -> None:
        """Call `fn(error)` once the write is durable (error None) or has failed; from any thread."""
        ...


class LedgerPort(Protocol):
    """What actors need of the ledger (supervisors/ledger/ implements it)."""

    def run_of(self, key: str) -> str:
        """The run the job `key` (`name/seed-N`) belongs to: an attempt's log header names it."""
        ...

    def queue_intent(self, *, name: str, cloud: str, job: str, seed: int, attempt: int, deadline: float,
                     offer: Offer | None = None) -> Pending:
        """The create call goes out only once this is durable."""
        ...

    def queue_cache(self, *, cloud: str, region: str, name: str, size_gb: int, usd_per_gb_month: float) -> Pending:
        """A cache volume's row: the provider is asked to find or make it only once this is durable."""
        ...

    def record_cache(self, *, cloud: str, region: str, name: str, volume_id: str, created_at: float) -> None: ...
    def record_launched(self, machine: Machine) -> None: ...
    def record_started(self, name: str, work: str, pid: int, launched_at: float) -> None: ...
    def record_taken(self, name: str, at: float) -> None: ...
    def queue_handle(self, name: str, work: str, handle: str, launched_at: float) -> Pending: ...
    def record_gone(self, name: str, at: float, reason: str) -> None: ...
    def queue_gone(self, name: str, at: float, reason: str) -> Pending: ...
    def record_delete_failed(self, name: str, detail: str) -> None: ...

    def still_holds(self, name: str) -> bool:
        """False once another controller is known to have taken over the job of the machine `name`
        (a shared ledger's fencing): the machine is then that controller's to keep or delete, not
        ours. Answers from what this process knows, at once."""
        ...

    def check_hold(self, name: str) -> Pending | None:
        """Ask the ledger whether the job of the machine `name` is still ours (queued; once it is
        done, `still_holds` has the ledger's answer); None when there is nothing to ask (not a
        shared ledger, or not a job this controller claimed)."""
        ...

    def write_file(self, key: str, write: Callable[[], object]) -> None:
        """Run `write` (it writes the job `key`'s files: log bytes, response.json) only while this
        controller holds the job: at once without a shared ledger; on one, after the ledger's fence
        proved the claim, in order with the job's rows, never once the claim is lost."""
        ...

    def check_job(self, key: str) -> Pending | None:
        """Ask the ledger whether the job `key` is still ours (once done, `may_write` answers); None
        when there is nothing to ask."""
        ...

    def may_write(self, key: str) -> bool:
        """Whether this controller still holds the job `key` (what this process knows now)."""
        ...


class Context:
    """What an attempt's actors share: the reactor, the clouds, the ledger and where events go.
    Set up once by the Runner; read-only afterwards except `workspaces` (one entry per leased
    machine, written by its lease)."""

    def __init__(
        self, *, reactor: Reactor, clouds: dict[str, Cloud], ledger: LedgerPort,
        emit: Callable[[Event], None], owner: str, out_root: Path, meter_period_s: float = 5.0,
        delete_timeout_s: float = 120.0, fault: Callable[[str, str], None] | None = None,
    ) -> None:
        self.reactor = reactor
        self.clouds = clouds
        self.ledger = ledger
        self.emit = emit
        self.owner = owner
        self.out_root = out_root
        self.meter_period_s = meter_period_s
        self.delete_timeout_s = delete_timeout_s
        self.workspaces: dict[str, Workspace] = {}
        self.hash_cache: dict[tuple[str, int, int, int], str] = {}
        self.hash_lock = threading.Lock()
        self.fault = fault
        # set (from any thread) by the Runner's whole cancel before any message goes: from then on no
        # create call starts, whatever is queued (a lease's launch checks it just before the create)
        self.stopping = Flag()
        self.stop_reason: tuple[Code, str] = (Code.CANCELED, "canceled")  # what a job not yet told ends with

    def stop(self, failure: Code, detail: str) -> None:
        """The whole run is being cancelled (any thread): `stopping` set, and what a job or batch that
        has not been told yet ends with (`stop_reason`), the reason written first."""
        self.stop_reason = (failure, detail or "canceled")
        self.stopping.set()

    def at(self, step: str, key: str) -> None:
        """A step of job `key`'s life is about to run (`out_folder`, `budget`, `names`, `response`,
        `event:<message>` in its job supervisor, `batch:<message>` in the batch supervisor): the
        fault hook, when one is set (tests, chaos drills), may raise there, which is that step's
        crash as a bug would make it. Without a hook, nothing."""
        if self.fault is not None:
            self.fault(step, key)


_FIRED: Result[None] = outcome.Value(None)  # what a timer hands its _Reply


class _Reply:
    """A reactor task's on_done for `Actor.spawn`: tell the actor what `reply` makes of the end
    (one object where a closure, its cells and a holder list were five for the collector to walk)."""

    __slots__ = ("actor", "reply", "task", "to")

    def __init__(self, actor: Actor, reply: Callable[[Result[Any]], Message | None],
                 to: pykka.ActorRef[Any] | None = None) -> None:
        self.actor = actor
        self.reply = reply
        self.task: Task | None = None
        self.to = to  # told instead of the actor (its parent), while the actor lives

    def __call__(self, result: Result[Any]) -> None:  # on the reactor thread
        actor = self.actor
        if self.task is not None:
            actor._tasks.discard(self.task)
        to = self.to
        if to is not None and actor.actor_stopped.is_set():
            return  # stopped meanwhile: its answer would have gone nowhere, so none goes on
        message = self.reply(result)
        if message is None:
            return
        # dead: stopped meanwhile; its on_stop cancelled or outlived this task
        with contextlib.suppress(pykka.ActorDeadError):
            (to if to is not None else actor.actor_ref).tell(message)


class Actor(PooledActor):
    """A pykka actor whose waiting happens on the reactor; results come back as messages."""

    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any] | None, label: str) -> None:
        super().__init__()
        self.ctx = ctx
        self.parent = parent
        self.label = label
        self._tasks: set[Task | Subscription] = set()  # cancelled when the actor stops
        self._log: Any = None

    @property
    def log(self) -> Any:
        """The logger (protocols/logs.py) bound to this actor's label, and to the job and attempt it works for
        (bound on first use: most actors never log)."""
        if self._log is None:
            self._log = logger.bind(actor=self.label, **label_context(self.label))
        return self._log

    def spawn(self, fn: Callable[..., Any], *args: Any,
              reply: Callable[[Result[Any]], Message | None], to: pykka.ActorRef[Any] | None = None) -> Task:
        """Run `fn(*args)` on the reactor; `reply(outcome)` is told to this actor when it ends
        (unless it is None: nothing to hear). With `to` (the parent), what `reply` makes of the end
        is told there straight from the reactor, while this actor lives: an answer this actor would
        only pass on costs no turn of its own."""
        done = _Reply(self, reply, to)
        task = self.ctx.reactor.spawn(fn, *args, on_done=done, name=f"{self.label}:{getattr(fn, '__name__', 'task')}")
        return self._track(task, done)

    def later(self, delay: float, message: Message) -> Task:
        """Tell this actor `message` after `delay` seconds (cancel the task to call it off)."""
        done = _Reply(self, lambda _fired: message)
        task = self.ctx.reactor.call_later(delay, functools.partial(done, _FIRED), name=f"{self.label}:timer")
        return self._track(task, done)

    def _track(self, task: Task, done: _Reply) -> Task:
        """Keep `task` until it ends (`done` lets go of it then) or the actor stops (cancelled)."""
        done.task = task
        self._tasks.add(task)
        if task.done:  # it ended before `done.task` was set: not discarded there
            self._tasks.discard(task)
        return task

    def on_clock(self, period: float, beat: Callable[[], bool]) -> Subscription:
        """Call `beat()` on the reactor thread at every beat of the shared clock of `period` seconds,
        until it returns False, the subscription is cancelled, or the actor stops: for work that needs
        no turn of this actor's (it must not wait, and touches only what it was given)."""
        sub = Subscription(beat)
        self.ctx.reactor.soon(functools.partial(subscribe, period, sub))
        self._tasks.add(sub)
        return sub

    def stop_now(self) -> None:
        """Stop at the end of this turn (`on_stop` runs now): for an actor that has told its end and
        holds nothing. Its stop was put off until the pool was idle, out of the burst's way, but
        was then a tell and a turn of its own: more of the CPU an end burst is short of (item 63)."""
        self._stop()

    def stop_soon(self, child: pykka.ActorRef[Any]) -> None:
        """Stop `child` after what is already in its inbox, without waiting (nor making the future
        `ActorRef.stop` makes for an answer nobody reads): here and now if it is idle (its
        `on_stop` in this turn, no tell nor turn of its own: `PooledActor.stop_if_idle`), else told."""
        if stop_if_idle(child):
            return
        with contextlib.suppress(pykka.ActorDeadError):
            child.tell(_ActorStop())

    def cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()

    def tell_parent(self, message: Message) -> None:
        if self.parent is not None:
            try:
                self.parent.tell(message)
            except pykka.ActorDeadError:
                self.log.debug("parent gone; dropped {}", type(message).__name__)

    def on_receive(self, message: Any) -> Any:
        return self.handle(message)

    def handle(self, message: Any) -> Any:
        raise NotImplementedError

    def on_stop(self) -> None:
        """Actor thread, after stop(): cancel what this actor still waits for."""
        self.cancel_tasks()

    def on_failure(
        self, exception_type: type[BaseException] | None, exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Actor thread, after a raise in a handler: cancel its tasks, tell the parent."""
        self.cancel_tasks()
        # the traceback to the run's log file only (`traceback` bound): the terminal shows one line
        # for the job's end, never a traceback
        self.log.bind(traceback=True).error("{} failed:\n{}", self.label,
                                             failure_text(exception_type, exception_value, traceback))
        self.tell_parent(ChildFailed(child=self.label, detail=error_text(exception_type, exception_value)))
