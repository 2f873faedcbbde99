"""The lease (actors/lease.py): whatever happens, its machine is deleted, and the ledger says so."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka
import trio
from actor_kit import LOCAL, SIM, Mailbox, ProbeHandle, fast_sim, machine_name
from support.waits import poll

from actor_run.actors import Context, LeaseActor
from actor_run.actors.lease import LeaseState
from actor_run.actors.pool import POOL
from actor_run.protocols.clouds.sim import SimCloud, SimSettings, set_fail_deletes, sim_machines
from actor_run.protocols.failures import Code
from actor_run.protocols.messages import (
    Acquire,
    ChildFailed,
    Leased,
    LeaseFailed,
    LeaseRequested,
    Offer,
    Release,
    Released,
)
from actor_run.supervisors.ledger import Ledger, LedgerReader


def start_lease(ctx: Context, probe: ProbeHandle, launch_timeout_s: float = 10.0) -> pykka.ActorRef[Any]:
    return LeaseActor.start(ctx, probe.ref, job="t", seed=1, attempt=0, launch_timeout_s=launch_timeout_s)


def acquire(lease: pykka.ActorRef[Any], ctx: Context, offer: Offer) -> str:
    name = machine_name(ctx)
    lease.tell(Acquire(offer=offer, name=name, deadline=time.time() + 3600))
    return name


def local_machines(state_dir: Path) -> list[str]:
    return sorted(p.name.removesuffix(".json") for p in (state_dir / "local").glob("*.json"))


def sim_dir(ctx: Context) -> Path:
    cloud = ctx.clouds["sim"]
    assert isinstance(cloud, SimCloud)
    return cloud.dir


def test_the_lease_state_goes_from_idle_through_launching_to_launched(ctx: Context, probe: ProbeHandle) -> None:
    lease = start_lease(ctx, probe)
    try:
        assert lease.proxy().state.get(timeout=10) is LeaseState.IDLE
        acquire(lease, ctx, LOCAL)
        probe.wait_for(Leased)
        assert lease.proxy().state.get(timeout=10) is LeaseState.LAUNCHED
        lease.tell(Release())
        assert probe.wait_for(Released).confirmed
    finally:
        lease.stop()


def test_which_lease_states_are_releasing_and_deleting() -> None:
    releasing = {s for s in LeaseState if s.releasing}
    assert releasing == {LeaseState.CANCELLING, LeaseState.CHECKING, LeaseState.DELETING, LeaseState.RECORDING,
                         LeaseState.RELEASED}
    assert {s for s in LeaseState if s.deleting} == {LeaseState.DELETING, LeaseState.RECORDING}


def test_release_deletes_the_machine_and_closes_the_ledger_row(
    ctx: Context, probe: ProbeHandle, reader: LedgerReader, state_dir: Path, emitted: Mailbox,
) -> None:
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, LOCAL)
        leased = probe.wait_for(Leased)
        assert leased.machine.name == name
        assert local_machines(state_dir) == [name]
        assert Path(leased.machine.root).is_dir()
        assert name in ctx.workspaces
        row = reader.machine(name)
        assert row is not None
        assert row.state == "alive"

        lease.tell(Release())
        released = probe.wait_for(Released)
        assert (released.machine, released.confirmed) == (name, True)
        assert local_machines(state_dir) == []
        assert not Path(leased.machine.root).exists()
        assert name not in ctx.workspaces
        row = reader.machine(name)
        assert row is not None
        assert (row.state, row.phase, row.reason) == ("deleted", "deleted", "deleted")
        assert emitted.wait_for(Released).confirmed
        assert lease.actor_stopped.wait(10), "the lease did not stop after Release"
    finally:
        lease.stop()


def test_stop_after_leased_deletes_the_machine(
    ctx: Context, probe: ProbeHandle, reader: LedgerReader, state_dir: Path,
) -> None:
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, LOCAL)
        probe.wait_for(Leased)
        assert local_machines(state_dir) == [name]
    finally:
        lease.stop()
    # on_stop waited for the deletion: gone by the time stop() returned
    assert local_machines(state_dir) == []
    released = probe.wait_for(Released)
    assert (released.machine, released.confirmed) == (name, True)
    row = reader.machine(name)
    assert row is not None
    assert row.state == "deleted"


def test_an_exception_in_the_lease_deletes_the_machine_and_tells_the_parent(
    ctx: Context, probe: ProbeHandle, reader: LedgerReader, state_dir: Path,
) -> None:
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, LOCAL)
        probe.wait_for(Leased)
        lease.tell("an unknown message")
        failed = probe.wait_for(ChildFailed)
        assert failed.child == "lease:t/1/a0"
        assert "TypeError" in failed.detail
        # the parent hears of the failure first (so the attempt ends `internal`), then the lease
        # deletes the machine and says Released once it is gone
        released = probe.wait_for(Released)
        assert released.confirmed
        assert local_machines(state_dir) == []
        assert probe.box.seen.index(failed) < probe.box.seen.index(released)
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
        assert lease.actor_stopped.wait(10)
    finally:
        lease.stop()


def test_a_clean_refusal_is_lease_failed_and_closes_the_ledger_row(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader,
) -> None:
    ctx = make_context(sim=fast_sim(no_capacity_rate=1.0))
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, SIM)
        failed = probe.wait_for(LeaseFailed)
        assert failed.failure == Code.NO_CAPACITY
        assert sim_machines(sim_dir(ctx)) == []
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
        assert row.reason == "create refused: no_capacity"
    finally:
        lease.stop()
    released = probe.wait_for(Released)
    assert released.confirmed


def test_a_refusal_waits_for_its_row_on_the_ledger_not_on_a_pool_thread(
    make_context: Callable[..., Context], probe: ProbeHandle, ledger: Ledger, reader: LedgerReader,
    emitted: Mailbox,
) -> None:
    ctx = make_context(sim=SimSettings(launch_latency_s=0.5, delete_latency_s=0.0, no_capacity_rate=1.0))
    lease = start_lease(ctx, probe)
    blocker = sqlite3.connect(ledger.path, isolation_level=None)
    try:
        name = acquire(lease, ctx, SIM)
        emitted.wait_for(LeaseRequested)
        ledger.flush()  # the intent is durable: the create is out, its refusal comes in 0.5 s
        blocker.execute("BEGIN IMMEDIATE")  # the row that closes the intent cannot commit meanwhile
        time.sleep(1.0)  # the thing under test: a second in which no worker may block on the ledger
        assert POOL.statistics()["blocked"] == 0  # no worker waits for the ledger
        assert probe.box.of(LeaseFailed) == []  # the parent hears it once the row is closed
        blocker.execute("ROLLBACK")
        failed = probe.wait_for(LeaseFailed)
        assert failed.failure == Code.NO_CAPACITY
        row = reader.machine(name)
        assert row is not None
        assert (row.state, row.reason) == ("deleted", "create refused: no_capacity")
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
        lease.stop()


def test_an_ambiguous_create_is_reconciled_by_name_on_release(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader,
) -> None:
    ctx = make_context(sim=fast_sim(ambiguous_rate=1.0))
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, SIM)
        failed = probe.wait_for(LeaseFailed)
        assert failed.failure == Code.AMBIGUOUS_CREATE
        assert sim_machines(sim_dir(ctx)) == [name]  # the create did make a machine
        row = reader.machine(name)
        assert row is not None
        assert row.state == "alive"

        lease.tell(Release())
        released = probe.wait_for(Released)
        assert (released.machine, released.confirmed) == (name, True)
        assert sim_machines(sim_dir(ctx)) == []
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
    finally:
        lease.stop()


class CreateThenOwnTimeout:
    """A provider whose create makes the machine, then answers with a timeout of its own (an HTTP
    client's read timeout): the sim cloud for everything else."""

    def __init__(self, sim: SimCloud) -> None:
        self.sim = sim
        self.name = sim.name

    async def launch(self, offer: Offer, name: str, deadline: float) -> Any:
        await self.sim.launch(offer, name, deadline)
        raise trio.TooSlowError("read timed out")

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.sim, attr)


def test_a_providers_own_timeout_in_the_create_is_ambiguous_and_the_machine_deleted(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader,
) -> None:
    ctx = make_context()
    folder = sim_dir(ctx)
    ctx.clouds["sim"] = CreateThenOwnTimeout(ctx.clouds["sim"])  # type: ignore[arg-type]
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, SIM)
        failed = probe.wait_for(LeaseFailed)
        assert failed.failure == Code.AMBIGUOUS_CREATE  # not a clean refusal: a machine may exist
        assert sim_machines(folder) == [name]
        lease.tell(Release())
        released = probe.wait_for(Released)
        assert (released.machine, released.confirmed) == (name, True)
        assert sim_machines(folder) == []
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
    finally:
        lease.stop()


def test_the_intent_is_in_the_ledger_before_the_create_call(
    make_context: Callable[..., Context], probe: ProbeHandle, ledger: Ledger, reader: LedgerReader,
    emitted: Mailbox,
) -> None:
    ctx = make_context(sim=SimSettings(launch_latency_s=0.2, delete_latency_s=0.0))
    lease = start_lease(ctx, probe)
    # another connection holds SQLite's write lock: the intent cannot commit until it lets go
    blocker = sqlite3.connect(ledger.path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        name = acquire(lease, ctx, SIM)
        requested = emitted.wait_for(LeaseRequested)
        assert requested.name == name
        # the thing under test: five launch latencies in which no create may go out (one that did
        # not wait for the intent made a machine by now)
        time.sleep(1.0)
        assert sim_machines(sim_dir(ctx)) == []
        assert reader.machine(name) is None
        blocker.execute("ROLLBACK")
        # the intent commits, then the create goes out (0.2 s of latency): the row is there first
        row = poll(lambda: reader.machine(name), 10, "the intent's row", every=0.01)
        assert sim_machines(sim_dir(ctx)) == []
        assert row is not None
        assert (row.state, row.phase, row.cloud, row.owner) == ("alive", "requested", "sim", ctx.owner)
        assert row.deadline == requested.deadline

        leased = probe.wait_for(Leased)
        assert sim_machines(sim_dir(ctx)) == [name]
        ledger.flush()  # record_launched is not waited for (only the intent must be durable first)
        row = reader.machine(name)
        assert row is not None
        assert row.phase == "launched"
        assert row.machine_id == leased.machine.id
        lease.tell(Release())
        assert probe.wait_for(Released).confirmed
        assert sim_machines(sim_dir(ctx)) == []
    finally:
        if blocker.in_transaction:
            blocker.execute("ROLLBACK")
        blocker.close()
        lease.stop()


def test_release_while_the_launch_is_in_flight_leaves_no_machine(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader, emitted: Mailbox,
) -> None:
    ctx = make_context(sim=SimSettings(launch_latency_s=0.5, delete_latency_s=0.0))
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, SIM)
        emitted.wait_for(LeaseRequested)
        lease.tell(Release())
        released = probe.wait_for(Released)
        assert (released.machine, released.confirmed) == (name, True)
        assert lease.actor_stopped.wait(10)
        assert sim_machines(sim_dir(ctx)) == []
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
        assert not probe.box.of(Leased)
        # the Acquire is answered too: its launch was cancelled
        assert [f.failure for f in probe.box.of(LeaseFailed)] in ([], [Code.CANCELED])
    finally:
        lease.stop()


def test_a_delete_the_provider_refuses_leaves_the_row_open(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader,
) -> None:
    # a try's bound is a fifth of it: long enough for the sim's refusal on a loaded machine
    ctx = make_context(delete_timeout_s=3.0)
    sim = ctx.clouds["sim"]
    lease = start_lease(ctx, probe)
    name = ""
    try:
        name = acquire(lease, ctx, SIM)
        probe.wait_for(Leased)
        set_fail_deletes(sim_dir(ctx), True)
        lease.tell(Release())
        released = probe.wait_for(Released, timeout=30)
        assert released.machine == name
        assert released.confirmed is False
        assert "refused" in released.detail
        assert sim_machines(sim_dir(ctx)) == [name]
        row = reader.machine(name)
        assert row is not None
        assert (row.state, row.phase) == ("alive", "delete_failed")
        assert row.detail is not None
        assert "refused" in row.detail
        assert lease.actor_stopped.wait(10)
    finally:
        lease.stop()
        set_fail_deletes(sim_dir(ctx), False)
        if name:
            ctx.reactor.call(sim.delete, name, timeout=30)
    assert sim_machines(sim_dir(ctx)) == []


def test_a_refused_delete_is_given_up_within_delete_timeout_s(
    make_context: Callable[..., Context], probe: ProbeHandle,
) -> None:
    # a try's bound is a fifth of it: long enough for the sim's refusal on a loaded machine
    ctx = make_context(delete_timeout_s=3.0)
    sim = ctx.clouds["sim"]
    lease = start_lease(ctx, probe)
    try:
        acquire(lease, ctx, SIM)
        probe.wait_for(Leased)
        set_fail_deletes(sim_dir(ctx), True)
        lease.tell(Release())
        released = probe.wait_for(Released, timeout=ctx.delete_timeout_s + 1.0)
        assert released.confirmed is False
    finally:
        set_fail_deletes(sim_dir(ctx), False)
        if not probe.box.of(Released):
            probe.wait_for(Released, timeout=30)  # the lease's next try succeeds
        lease.stop()
        for left in sim_machines(sim_dir(ctx)):
            ctx.reactor.call(sim.delete, left, timeout=30)


def test_stop_while_a_release_is_deleting_returns_once_the_machine_is_gone(
    make_context: Callable[..., Context], probe: ProbeHandle,
) -> None:
    # each delete try may take delete_timeout_s / 5 = 0.1 s: the sim's 0.02 s of latency fits
    ctx = make_context(sim=SimSettings(launch_latency_s=0.01, delete_latency_s=0.02), delete_timeout_s=0.5)
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, SIM)
        probe.wait_for(Leased)
        lease.tell(Release())  # handled before the stop below: the deletion is under way when it comes
        t0 = time.monotonic()
    finally:
        lease.stop()
    took = time.monotonic() - t0
    assert sim_machines(sim_dir(ctx)) == []
    released = probe.wait_for(Released)
    assert (released.machine, released.confirmed) == (name, True)
    assert took < 5.0, f"stop() took {took:.1f} s for a deletion of a few ms"


def test_a_machine_that_never_answers_is_launch_failed_and_deleted_on_release(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader,
) -> None:
    ctx = make_context(sim=fast_sim(boot_failure_rate=1.0))
    lease = start_lease(ctx, probe)
    try:
        name = acquire(lease, ctx, SIM)
        failed = probe.wait_for(LeaseFailed)
        assert failed.failure == Code.LAUNCH_FAILED
        assert "could not be reached" in failed.detail
        assert sim_machines(sim_dir(ctx)) == [name]  # it exists and bills: the lease still holds it
        assert name not in ctx.workspaces
        lease.tell(Release())
        assert probe.wait_for(Released).confirmed
        assert sim_machines(sim_dir(ctx)) == []
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
    finally:
        lease.stop()


def test_a_create_with_no_answer_in_time_is_ambiguous_and_reconciled(
    make_context: Callable[..., Context], probe: ProbeHandle, reader: LedgerReader,
) -> None:
    ctx = make_context(sim=SimSettings(launch_latency_s=5.0, delete_latency_s=0.0))
    lease = start_lease(ctx, probe, launch_timeout_s=0.2)
    try:
        name = acquire(lease, ctx, SIM)
        failed = probe.wait_for(LeaseFailed)
        assert failed.failure == Code.AMBIGUOUS_CREATE
        assert "no answer to the create" in failed.detail
        row = reader.machine(name)
        assert row is not None
        assert row.state == "alive"
        lease.tell(Release())
        released = probe.wait_for(Released)
        assert (released.machine, released.confirmed) == (name, True)
        assert sim_machines(sim_dir(ctx)) == []
        row = reader.machine(name)
        assert row is not None
        assert row.state == "deleted"
    finally:
        lease.stop()
