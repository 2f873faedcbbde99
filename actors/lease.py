"""LeaseActor: holds one machine, and whatever happens, deletes it.

`Acquire` records the intent (name, deadline) in the ledger BEFORE the create call (the launch
waits on the reactor until the row is committed), so a crash between create and answer leaves a
name to sweep; then launches on the reactor and connects a workspace. It answers its parent
`Leased(machine)` or `LeaseFailed(failure)`.

On its way up it says where the machine is (`LeaseStage`): `booting` once the create goes out,
`waiting for ssh` once the provider says ready and the cloud's connect (a wait with backoff, not
one try) begins. A machine whose cloud asks for a check (`machine_check`: its GPUs and clock,
clouds/verify.py) is checked right after the connect, before `Leased`: one that fails is
`LeaseFailed(launch_failed)` naming what was wrong, and is deleted; nothing was uploaded to it
(actors/machine_check.py). A candidate's `cache` is found or made before the create and, on a
cloud that attaches it to a running machine, attached and mounted after the check (actors/caches.py).

`Release` deletes the machine on the reactor (retried, bounded in time), answers `Released` and
stops. If the actor is stopped or fails before that, `on_stop` / `on_failure` do the same
deletion on the actor's thread, waiting for it (the one place an actor waits on the network: after
this hook the actor is gone). A deletion the provider never confirms leaves the ledger row open
for the next sweep and says so in `Released(confirmed=False)`.

Its lifecycle is one `LeaseState` (the actor's thread reads and writes it):

    IDLE --Acquire/Adopt--> LAUNCHING --launch answered--> LAUNCHED
    LAUNCHING --Release, create still out--> CANCELLING --launch answered--> CHECKING (or RELEASED: refused)
    IDLE, LAUNCHED, LAUNCHING (answer on its way) --Release--> CHECKING (or RELEASED: nothing named)
    CHECKING --still ours--> DELETING; --another controller took the job--> RELEASED (left as it is)
    DELETING --confirmed--> RECORDING --the ledger has it--> RELEASED
    DELETING --unconfirmed--> RELEASED (the row stays open for the next sweep)
    any --stop or a raise--> RELEASED (on_stop / on_failure delete on the actor's thread, waiting)

`Released` is said once, on entering RELEASED. CHECKING asks a shared ledger (without holding a
thread) whether the job is still this controller's; on a local ledger it passes at once.
"""

from __future__ import annotations

import contextlib
import enum
import time
from types import TracebackType
from typing import Any

import msgspec
import outcome
import pykka
import trio

from actor_run.actors.base import Actor, Context, Pending
from actor_run.actors.caches import CacheOpener, record_cache_opened
from actor_run.actors.deletion import delete_confirmed
from actor_run.actors.durable import INTENT_WAIT_S, wait_durable
from actor_run.actors.flag import Flag
from actor_run.actors.machine_check import check_machine, classify_launch, closed_on_failure
from actor_run.actors.pool import blocking
from actor_run.actors.runtime import Result, Task
from actor_run.protocols.clouds import Booting, cloud_key
from actor_run.protocols.failures import (
    ActorRunError,
    CallCancelled,
    Code,
    LaunchAmbiguous,
    LaunchRefused,
    MachineGone,
)
from actor_run.protocols.hosts.workspace import Workspace
from actor_run.protocols.messages import (
    Acquire,
    Adopt,
    CacheOpened,
    CacheSpec,
    Leased,
    LeaseFailed,
    LeaseRequested,
    LeaseStage,
    Machine,
    Message,
    Offer,
    Release,
    Released,
)


class LeaseState(enum.Enum):
    """Where a lease is in its life (the transitions are in the module docstring)."""

    IDLE = "idle"  # no Acquire or Adopt yet: nothing to delete
    LAUNCHING = "launching"  # the create (or an adopted machine's connect) is out on the reactor
    LAUNCHED = "launched"  # the launch answered: Leased, or LeaseFailed (a machine may exist all the same)
    CANCELLING = "cancelling"  # a Release came while the create was out: cancelled, deleted once it answers
    CHECKING = "checking"  # releasing: asking a shared ledger whether the job is still ours
    DELETING = "deleting"  # the delete is out on the reactor
    RECORDING = "recording"  # the provider confirmed the delete: the ledger is writing it down
    RELEASED = "released"  # `Released` said: nothing left to hold

    @property
    def releasing(self) -> bool:
        """A Release is under way (or done): a second one changes nothing."""
        return self not in (LeaseState.IDLE, LeaseState.LAUNCHING, LeaseState.LAUNCHED)

    @property
    def deleting(self) -> bool:
        """The delete task went out: finishing it is this controller's, whatever the ledger says."""
        return self in (LeaseState.DELETING, LeaseState.RECORDING)


class _Launched(Message, frozen=True, kw_only=True):
    result: Any  # Result[tuple[Machine, Workspace]]


class _Deleted(Message, frozen=True, kw_only=True):
    result: Any  # Result[tuple[bool, str]]


class _Stage(Message, frozen=True, kw_only=True):
    """The launch task passed a point worth showing (told from the reactor)."""

    stage: str


class _CacheNote(Message, frozen=True, kw_only=True):
    """The cache was found or made (or the place starts cold): told from the launch task."""

    event: CacheOpened


class _GoneRecorded(Message, frozen=True, kw_only=True):
    at: float


class _RefusalRecorded(Message, frozen=True, kw_only=True):
    failed: LeaseFailed


class _HoldChecked(Message, frozen=True, kw_only=True):
    """The ledger checked whether this controller still holds the machine's job (a shared ledger)."""


class LeaseActor(Actor):
    def __init__(self, ctx: Context, parent: pykka.ActorRef[Any], *, job: str, seed: int, attempt: int,
                 launch_timeout_s: float) -> None:
        super().__init__(ctx, parent, f"lease:{job}/{seed}/a{attempt}")
        self.job, self.seed, self.attempt = job, seed, attempt
        self.launch_timeout_s = launch_timeout_s
        self.name: str | None = None  # set once the intent is in the ledger: from then on, delete by it
        self.offer: Offer | None = None
        self.machine: Machine | None = None
        self.state = LeaseState.IDLE
        self._launching: Task | None = None  # the launch task, while LAUNCHING or CANCELLING
        # the delete task's answer, kept where a stopping actor can wait for it (the reactor sets
        # them; its _Deleted message is dropped once pykka has unregistered the actor)
        self._delete_done = Flag()
        self._delete_result: tuple[bool, str] | None = None
        self._delete_asked_at: float | None = None  # when the delete that the provider confirmed went out

    def handle(self, message: Any) -> Any:
        match message:
            case Acquire(offer=offer, name=name, deadline=deadline, cache=cache):
                self._acquire(offer, name, deadline, cache)
            case _CacheNote(event=event):
                record_cache_opened(self.ctx, event)
            case Adopt(machine=machine):
                self._adopt(machine)
            case _Launched(result=result):
                self._launched(result)
            case Release():
                self._start_release()
            case _Deleted(result=result):
                self._finish_release(result)
            case _Stage(stage=stage):
                if self.name is not None and not self.state.releasing:
                    self.ctx.emit(LeaseStage(job=self.job, seed=self.seed, attempt=self.attempt, name=self.name,
                                             stage=stage))
            case _GoneRecorded(at=at):
                self._announce_released(True, "", at)
                self.stop_now()  # the machine is gone and the ledger has it: nothing left to hold
            case _RefusalRecorded(failed=failed):
                self.tell_parent(failed)
            case _HoldChecked():
                self._begin_delete()
            case _:
                raise TypeError(f"LeaseActor cannot handle {message!r}")

    # --- acquire ---------------------------------------------------------------------------------

    def _acquire(self, offer: Offer, name: str, deadline: float, cache: CacheSpec | None = None) -> None:
        key = cloud_key(offer.cloud, offer.account)
        cloud = self.ctx.clouds[key]
        head: dict[str, Any] = {"job": self.job, "seed": self.seed, "attempt": self.attempt}
        ref = self.actor_ref

        def note(event: CacheOpened) -> None:  # on the reactor
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_CacheNote(event=event))

        opener = CacheOpener(self.ctx, cloud, key, offer, cache, head, note)  # its row queued (or a cold start said)
        # queued, not waited for here: the launch below waits for it on the reactor before the create
        # goes out, so a thousand leases starting at once hold no thread while the ledger commits
        intent = self.ctx.ledger.queue_intent(name=name, cloud=key, job=self.job, seed=self.seed,
                                              attempt=self.attempt, deadline=deadline, offer=offer)
        soon = self.ctx.reactor.soon
        self.name, self.offer = name, offer
        self.ctx.emit(LeaseRequested(job=self.job, seed=self.seed, attempt=self.attempt, name=name,
                                     cloud=key, deadline=deadline))

        timeout = self.launch_timeout_s
        # a cloud whose machines boot (a rented VM) has stages worth showing; a sandbox does not,
        # and a thousand of them should not pay two events each
        boots = isinstance(cloud, Booting) and cloud.boots

        def stage(what: str) -> None:  # on the reactor: the actor says it (or is gone: nobody to tell)
            if boots:
                with contextlib.suppress(pykka.ActorDeadError):
                    ref.tell(_Stage(stage=what))

        stopping = self.ctx.stopping

        async def launch() -> tuple[Machine, Workspace | None, BaseException | None]:
            await wait_durable(intent, soon)
            if stopping.is_set():  # a Ctrl-C or a cancel of everything came first: no create starts after it
                raise LaunchRefused("the run is stopping: no machine was created", code=Code.CANCELED)
            placed = await opener.place(offer, soon)
            stage("booting")
            machine: Machine | None = None
            # one scope, `timeout` for the create and again for the connect (a thousand launches at
            # once: each cancel scope costs the reactor tens of microseconds)
            scope = trio.CancelScope(deadline=trio.current_time() + timeout)
            try:
                with scope:
                    machine = await cloud.launch(placed, name, deadline)
                    if machine.account != offer.account:  # the account it bills, whichever cloud made it
                        machine = msgspec.structs.replace(machine, account=offer.account)
                    scope.deadline = trio.current_time() + timeout
                    stage("waiting for ssh")
                    workspace = await cloud.connect(machine)
                    await closed_on_failure(workspace, check_machine(cloud, offer, machine, workspace))
                if not scope.cancelled_caught and machine is not None:
                    # outside the connect's time: the attach has waits of its own, and a slow cache that is
                    # not required starts cold instead of costing the machine
                    machine = await closed_on_failure(workspace, opener.attach(placed, machine, workspace))
                    return machine, workspace, None
            except trio.TooSlowError as exc:  # a provider's own timeout: the create may have made one
                if machine is None:
                    raise LaunchAmbiguous(f"the create timed out: {exc}") from exc
                return machine, None, exc
            except (ActorRunError, OSError) as exc:
                if machine is None:
                    raise
                return machine, None, exc  # it exists: the release deletes it by id
            # this scope's deadline passed
            if machine is None:
                raise LaunchAmbiguous(f"no answer to the create within {timeout:.0f} s")
            return machine, None, trio.TooSlowError(f"no connection within {timeout:.0f} s")

        self._launching = self.spawn(launch, reply=lambda r: _Launched(result=r))
        self.state = LeaseState.LAUNCHING

    def _adopt(self, machine: Machine) -> None:
        """A machine an earlier controller leased: connect to it; deleting it is ours now."""
        cloud = self.ctx.clouds[cloud_key(machine.cloud, machine.account)]
        self.name, self.machine = machine.name, machine
        self.offer = Offer(cloud=machine.cloud, region=machine.region, gpu=machine.gpu, hourly_usd=machine.hourly_usd,
                           account=machine.account)
        timeout = self.launch_timeout_s

        async def connect() -> tuple[Machine, Workspace | None, BaseException | None]:
            try:
                with trio.fail_after(timeout):
                    return machine, await cloud.connect(machine), None
            except (ActorRunError, OSError, trio.TooSlowError) as exc:
                return machine, None, exc

        self._launching = self.spawn(connect, reply=lambda r: _Launched(result=r))
        self.state = LeaseState.LAUNCHING

    def _launched(self, result: Result[tuple[Machine, Workspace | None, BaseException | None]]) -> None:
        assert self.name is not None
        self._launching = None
        exc: BaseException
        if self.state is LeaseState.CANCELLING:
            self._launched_after_release(result)
            return
        if self.state is LeaseState.LAUNCHING:  # (a Release that came as this answer was on its way: releasing)
            self.state = LeaseState.LAUNCHED
        if isinstance(result, outcome.Value):
            machine, workspace, error = result.value
            self.machine = machine
            self.ctx.ledger.record_launched(machine)
            if workspace is not None:
                self.ctx.workspaces[self.name] = workspace
                self.tell_parent(Leased(job=self.job, seed=self.seed, attempt=self.attempt, machine=machine))
                return
            assert error is not None
            exc = error
        else:
            exc = result.error
        code, detail = classify_launch(exc, created=self.machine is not None)
        failed = LeaseFailed(job=self.job, seed=self.seed, attempt=self.attempt, failure=code, detail=detail,
                             machine=self.machine, taken_at=exc.at if isinstance(exc, MachineGone) else None)
        clean = ((code in (Code.NO_CAPACITY, Code.QUOTA, Code.LAUNCH_FAILED)
                  or (code is Code.CANCELED and isinstance(exc, LaunchRefused)))  # no create started
                 and not isinstance(exc, LaunchAmbiguous))
        if clean and self.machine is None:
            # a clean refusal: no machine exists. The intent is closed, then the parent hears it,
            # without a pool thread waiting for the ledger (a region out of stock refuses many at
            # once); if the row cannot be written it stays open for the next sweep
            name, self.name = self.name, None
            self._tell_self_when(self.ctx.ledger.queue_gone(name, time.time(), f"create refused: {code}"),
                                 _RefusalRecorded(failed=failed))
            return
        self.tell_parent(failed)

    def _launched_after_release(
        self, result: Result[tuple[Machine, Workspace | None, BaseException | None]],
    ) -> None:
        """A Release came while the create was out: now that its answer is in (cancelled or not),
        delete whatever it made. Deleting earlier could miss a machine made a moment later."""
        assert self.name is not None
        if isinstance(result, outcome.Value):
            machine, workspace, _ = result.value
            self.machine = machine
            self.ctx.ledger.record_launched(machine)
            if workspace is not None:
                self.ctx.workspaces[self.name] = workspace  # _delete closes it
        elif isinstance(result.error, LaunchRefused) and not isinstance(result.error, LaunchAmbiguous):
            self.ctx.ledger.record_gone(self.name, time.time(), f"create refused: {result.error.code}")
            self.name = None
            self._done_releasing(True, "", time.time())
            self.stop()
            return
        self._begin_delete()

    # --- release ---------------------------------------------------------------------------------

    def _cloud_key(self) -> str:
        assert self.offer is not None
        return cloud_key(self.offer.cloud, self.offer.account)

    async def _delete(self, name: str, machine_id: str, cloud_name: str) -> tuple[bool, str]:
        """Close the workspace, then delete until the provider confirms (actors/deletion.py)."""

        def asked(at: float) -> None:
            self._delete_asked_at = at

        return await delete_confirmed(self.ctx.clouds[cloud_name], name, machine_id,
                                      self.ctx.workspaces.pop(name, None), self.ctx.delete_timeout_s, asked)

    async def _delete_recorded(self, name: str, machine_id: str, cloud_name: str) -> tuple[bool, str]:
        """_delete, with its answer also kept where a stopping actor can wait for it (its messages
        are dropped once pykka has unregistered it)."""
        try:
            result = await self._delete(name, machine_id, cloud_name)
        except BaseException as exc:
            self._delete_result = (False, f"{type(exc).__name__}: {exc}")
            raise
        else:
            self._delete_result = result
            return result
        finally:
            self._delete_done.set()

    def _start_release(self) -> None:
        if self.name is None:
            self._done_releasing(True, "", time.time())
            self.stop()
            return
        if self.state.releasing:
            return
        if self.state is LeaseState.LAUNCHING and self._launching is not None and not self._launching.done:
            # the create is out: cancel it and delete by name once it has answered
            self.state = LeaseState.CANCELLING
            self._launching.cancel()
            return
        self._begin_delete()

    def _let_go(self) -> bool:
        """The job was taken over by another controller (the ledger's fencing said so): its machine
        is the adopter's now, so it is left as it is and nothing more is written about it."""
        if self.name is None or self.ctx.ledger.still_holds(self.name):
            return False
        self._announce_released(False, "left to the controller that took over its job", time.time())
        return True

    def _begin_delete(self) -> None:
        assert self.name is not None
        assert self.offer is not None
        if self.state is not LeaseState.CHECKING:
            # on a shared ledger, ask it first (without holding a thread) whether the job is still ours
            self.state = LeaseState.CHECKING
            pending = self.ctx.ledger.check_hold(self.name)
            if pending is not None:
                self._tell_self_when(pending, _HoldChecked())
                return
        if self._let_go():
            self.stop()
            return
        self.state = LeaseState.DELETING
        self.cancel_tasks()
        machine_id = self.machine.id if self.machine else ""
        self.spawn(self._delete_recorded, self.name, machine_id, self._cloud_key(), reply=lambda r: _Deleted(result=r))

    def _finish_release(self, result: Result[tuple[bool, str]]) -> None:
        confirmed, detail = result.unwrap() if isinstance(result, outcome.Value) else (False, str(result.error))
        at = self._gone_at()
        if confirmed and self.name is not None and self.state is LeaseState.DELETING:
            # `Released` once the ledger has it, without holding a thread meanwhile (a thousand
            # releases at once); stopped before that, on_stop records and answers it itself
            self.state = LeaseState.RECORDING
            self._tell_self_when(self.ctx.ledger.queue_gone(self.name, at, "deleted"), _GoneRecorded(at=at))
            return
        self._done_releasing(confirmed, detail, at)
        self.stop()

    def _gone_at(self) -> float:
        """When the machine stopped billing: the confirmed delete's call, else now."""
        return self._delete_asked_at if self._delete_asked_at is not None else time.time()

    def _tell_self_when(self, pending: Pending, message: Message) -> None:
        """Tell this actor `message` once the ledger has `pending` (or could not write it)."""
        ref = self.actor_ref

        def recorded(_error: BaseException | None) -> None:  # on the ledger's thread
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(message)

        pending.when_done(recorded)

    def _done_releasing(self, confirmed: bool, detail: str, at: float) -> None:
        if self.state is LeaseState.RELEASED:
            return
        if self.name is not None:
            if confirmed:
                self.ctx.ledger.record_gone(self.name, at, "deleted")
            else:
                self.ctx.ledger.record_delete_failed(self.name, detail)
        self._announce_released(confirmed, detail, at)

    def _announce_released(self, confirmed: bool, detail: str, at: float) -> None:
        if self.state is LeaseState.RELEASED:
            return
        name = self.name or ""
        self.state = LeaseState.RELEASED
        event = Released(job=self.job, seed=self.seed, attempt=self.attempt, machine=name, confirmed=confirmed,
                         detail=detail, t=at)
        self.ctx.emit(event)
        self.tell_parent(event)

    def _release_blocking(self) -> None:
        """On the actor's thread: make sure the machine is gone before this actor is (unless the
        shared ledger says the job is another controller's now: asked here, waiting up to the
        bound on any waited ledger write)."""
        if self.state is LeaseState.RELEASED:
            return
        if not self.state.deleting:  # (once the delete is out, it is this controller's to finish)
            pending = self.ctx.ledger.check_hold(self.name) if self.name is not None else None
            if pending is not None:
                checked = Flag()
                pending.when_done(lambda _error: checked.set())
                with blocking():
                    checked.wait(INTENT_WAIT_S)
            if self._let_go():
                return
        if self.state.deleting:
            # the reactor is already deleting it: its answer cannot reach a stopped actor, so wait here
            with blocking():
                finished = self._delete_done.wait(self.ctx.delete_timeout_s + 10)
            if finished and self._delete_result is not None:
                self._done_releasing(*self._delete_result, self._gone_at())
                return
        launching = self._launching
        self.cancel_tasks()
        if launching is not None and not launching.done:
            # let the cancelled create answer first: a machine it makes a moment later is deleted too
            with blocking():
                launching.wait_finished(60)
        if self.name is None:
            self._done_releasing(True, "", time.time())
            return
        assert self.offer is not None
        try:
            confirmed, detail = self.ctx.reactor.call(
                self._delete, self.name, self.machine.id if self.machine else "", self._cloud_key(),
                timeout=self.ctx.delete_timeout_s + 30,
            )
        except CallCancelled as exc:
            confirmed, detail = False, str(exc)
        self._done_releasing(confirmed, detail, self._gone_at())

    def on_stop(self) -> None:
        """Actor thread, after stop(): delete the machine (waiting for the provider to confirm)."""
        self._release_blocking()

    def on_failure(self, exception_type: type[BaseException] | None, exception_value: BaseException | None,
                   traceback: TracebackType | None) -> None:
        """After a raise: tell the parent first (so it ends the attempt `internal`, not by whatever
        the deletion makes its other children see), then delete the machine as on_stop does; the
        parent hears `Released` when it is gone."""
        super().on_failure(exception_type, exception_value, traceback)
        self._release_blocking()
