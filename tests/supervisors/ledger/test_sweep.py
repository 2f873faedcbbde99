"""supervisors/ledger/sweep.py: orphan sweeps over a real sim cloud (its state in a folder) and a real
ledger: what goes, what stays, and --dry-run."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from support.cli_inproc import run_cli

from actor_run.protocols.clouds.sim import SimCloud, SimSettings, set_fail_deletes, sim_machines
from actor_run.protocols.messages import Offer
from actor_run.protocols.names import encode_name
from actor_run.supervisors.api.runner import Runner
from actor_run.supervisors.ledger import Ledger, LedgerReader
from actor_run.supervisors.ledger.sweep import SweepAction

SIM = {"launch_latency_s": 0.0, "delete_latency_s": 0.0}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class World:
    """A sim provider and a ledger (an SQLite file, or a shared PostgreSQL one) shared by a dead
    controller and a live one (this process)."""

    def __init__(self, tmp_path: Path, state_dir: Path, location: str | Path) -> None:
        self.tmp = tmp_path
        self.state = state_dir
        self.ledger_path = location if isinstance(location, str) else state_dir / "ledger.sqlite"
        self.cloud = SimCloud(SimSettings(**SIM), state_dir)  # type: ignore[arg-type]
        self.sim_dir = self.cloud.dir
        self.dead = Ledger(self.ledger_path, uuid.uuid4().hex)
        self.live = Ledger(self.ledger_path, uuid.uuid4().hex)
        self.live.register_owner()  # this process, with its start time (and on PostgreSQL its lease): alive
        self.live.record_cloud("sim", SIM)
        self.url = location if isinstance(location, str) else None
        if self.url is not None:
            # a teammate's controller whose lease runs out once it has written its intents
            # (expire_dead), on a host where a process with its pid lives (this one): dead for
            # everyone then, whatever its pid says
            self.dead.register_owner()
            self.expire_dead()
            return
        conn = sqlite3.connect(self.ledger_path)  # a controller that was killed: its pid is gone
        conn.execute(
            "INSERT INTO owners (id, pid, started, host, beat, closed) VALUES (?,?,?,?,?,0)",
            (self.dead.owner, _dead_pid(), time.time() - 5, socket.gethostname(), time.time()),
        )
        conn.commit()
        conn.close()

    def expire_dead(self) -> None:
        assert self.url is not None
        import psycopg

        with psycopg.connect(self.url) as conn:
            conn.execute("UPDATE owners SET lease_until = %s, host = 'laptop' WHERE id = %s",
                         (time.time() - 1, self.dead.owner))

    def intent(self, owner: Ledger, name: str, *, job: str, seed: int, deadline: float) -> None:
        """The intent `owner` recorded before launching `name`."""
        if owner is self.dead and self.url is not None:
            # the row it left, written while its lease held (it refuses every write now)
            import psycopg

            with psycopg.connect(self.url) as conn:
                conn.execute(
                    "INSERT INTO machines (name, cloud, owner, run, job, seed, attempt, deadline, state, phase,"
                    " created) VALUES (%s,'sim',%s,'',%s,%s,0,%s,'alive','requested',%s)",
                    (name, owner.owner, job, seed, deadline, time.time()))
            return
        owner.record_intent(name=name, cloud="sim", job=job, seed=seed, attempt=0, deadline=deadline)

    def machine(
        self,
        owner: Ledger | str,
        *,
        job: str = "j",
        seed: int = 1,
        deadline: float | None = None,
        record: bool = True,
        name: str | None = None,
    ) -> str:
        """Launch a sim machine named for `owner`; with `record`, the owner's ledger saw its intent first."""
        deadline = deadline if deadline is not None else time.time() + 3600
        owner_id = owner.owner if isinstance(owner, Ledger) else owner
        name = name or encode_name(job, seed, 0, owner_id, deadline)
        if record:
            assert isinstance(owner, Ledger)
            self.intent(owner, name, job=f"{job}/seed-{seed}", seed=seed, deadline=deadline)
        trio.run(self.cloud.launch, Offer(cloud="sim", region="us-east", gpu="A100"), name, deadline)
        return name

    def sweep(self, *, dry_run: bool = False, grace_s: float = 600.0) -> dict[str, SweepAction]:
        with Runner(out_dir=self.tmp / "out", state_dir=self.state, ledger=self.ledger_path, sweep_on_start=False,
                    sweep_grace_s=grace_s) as r:
            return {a.machine: a for a in r.sweep(dry_run=dry_run)}

    def row(self, name: str) -> Any:
        reader = LedgerReader(self.ledger_path)
        try:
            return reader.machine(name)
        finally:
            reader.close()

    def close(self) -> None:
        for name in sim_machines(self.sim_dir):  # whatever a test kept on purpose
            trio.run(self.cloud.delete, name)
        self.dead.close()
        self.live.close()


@pytest.fixture
def world(tmp_path: Path, state_dir: Path, ledger_location: str | Path) -> Iterator[World]:
    """Every test of this module runs on both backends."""
    w = World(tmp_path, state_dir, ledger_location)
    yield w
    w.close()


def test_a_machine_whose_owner_is_dead_is_deleted(world: World) -> None:
    name = world.machine(world.dead)
    assert world.row(name).state == "alive"
    actions = world.sweep()
    assert (actions[name].action, actions[name].reason, actions[name].owner) == (
        "deleted",
        "its owner is gone",
        world.dead.owner,
    )
    assert sim_machines(world.sim_dir) == []
    row = world.row(name)
    assert (row.state, row.reason) == ("deleted", "swept: its owner is gone")


def test_a_machine_of_a_live_owner_is_kept(world: World) -> None:
    name = world.machine(world.live)
    actions = world.sweep()
    assert actions[name].action == "keep"
    assert sim_machines(world.sim_dir) == [name]
    assert world.row(name).state == "alive"
    # once its owner has closed, it is nobody's: the next sweep deletes it
    world.live.close_owner()
    assert world.sweep()[name].action == "deleted"
    assert sim_machines(world.sim_dir) == []


def test_a_machine_past_its_deadline_goes_whoever_owns_it(world: World) -> None:
    late = world.machine(world.live, job="late", deadline=time.time() - 60)
    fresh = world.machine(world.live, job="fresh", deadline=time.time() + 3600)
    actions = world.sweep(grace_s=600.0)
    assert actions[late].action == "keep"  # 60 s late is within the grace
    actions = world.sweep(grace_s=5.0)
    assert (actions[late].action, actions[late].reason) == ("deleted", "past its deadline")
    assert actions[fresh].action == "keep"
    assert sim_machines(world.sim_dir) == [fresh]


def test_a_machine_the_ledger_never_heard_of(world: World) -> None:
    orphan = world.machine(world.dead.owner, job="orphan", record=False)
    mine = world.machine(world.live.owner, job="mine", record=False)
    actions = world.sweep()
    assert (actions[orphan].action, actions[orphan].reason) == (
        "deleted",
        "unknown to the ledger and its owner is gone",
    )
    assert actions[mine].action == "keep"  # its name says a live controller made it (the intent may be on its way)
    assert sim_machines(world.sim_dir) == [mine]


def test_machines_not_ours_are_never_touched(world: World) -> None:
    world.machine("x", name="someone-elses-box", record=False)
    actions = world.sweep(grace_s=0.0)
    assert "someone-elses-box" not in actions
    assert sim_machines(world.sim_dir) == ["someone-elses-box"]


def test_ledger_rows_of_machines_the_provider_no_longer_lists_are_closed(world: World) -> None:
    name = encode_name("ghost", 1, 0, world.dead.owner, time.time() + 3600)
    world.intent(world.dead, name, job="ghost/seed-1", seed=1, deadline=time.time() + 3600)
    kept = encode_name("ghost", 2, 0, world.live.owner, time.time() + 3600)
    world.live.record_intent(name=kept, cloud="sim", job="ghost/seed-2", seed=2, attempt=0, deadline=time.time() + 3600)
    actions = world.sweep()
    assert (actions[name].action, actions[name].reason) == ("closed", "the provider no longer lists it")
    assert world.row(name).state == "deleted"
    assert kept not in actions  # a live owner's create may be on its way
    assert world.row(kept).state == "alive"


def test_dry_run_deletes_nothing(world: World) -> None:
    gone = world.machine(world.dead, job="gone")
    unknown = world.machine(world.dead.owner, job="unknown", record=False)
    kept = world.machine(world.live, job="kept")
    before = sorted(sim_machines(world.sim_dir))
    actions = world.sweep(dry_run=True)
    assert {n: a.action for n, a in actions.items()} == {gone: "delete", unknown: "delete", kept: "keep"}
    assert sorted(sim_machines(world.sim_dir)) == before
    assert world.row(gone).state == "alive"
    actions = world.sweep()
    assert {n: a.action for n, a in actions.items()} == {gone: "deleted", unknown: "deleted", kept: "keep"}
    assert sim_machines(world.sim_dir) == [kept]


def test_a_runner_sweeps_when_it_opens(world: World) -> None:
    name = world.machine(world.dead)
    with Runner(out_dir=world.tmp / "out", state_dir=world.state, ledger=world.ledger_path) as r:
        assert [(a.machine, a.action) for a in r.swept] == [(name, "deleted")]
    assert sim_machines(world.sim_dir) == []


def test_a_failed_delete_stays_in_the_ledger(world: World) -> None:
    name = world.machine(world.dead)
    set_fail_deletes(world.sim_dir, True)
    try:
        actions = world.sweep()
    finally:
        set_fail_deletes(world.sim_dir, False)
    assert actions[name].action == "failed"
    assert "refused the delete" in actions[name].detail
    row = world.row(name)
    assert (row.state, row.phase) == ("alive", "delete_failed")
    assert world.sweep()[name].action == "deleted"  # the next sweep, once the provider answers


def _cli(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        ["sweep", "--state-dir", str(world.state), "--ledger", str(world.ledger_path), *args],
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_the_sweep_command(world: World) -> None:
    gone = world.machine(world.dead, job="gone")
    kept = world.machine(world.live, job="kept")
    dry = _cli(world, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    lines = [json.loads(line) for line in dry.stdout.splitlines()]
    assert {d["machine"]: d["action"] for d in lines} == {gone: "delete", kept: "keep"}
    assert sorted(sim_machines(world.sim_dir)) == sorted([gone, kept])
    assert world.row(gone).state == "alive"
    real = _cli(world)
    assert real.returncode == 0, real.stderr
    assert gone in real.stdout
    assert "deleted" in real.stdout
    assert sim_machines(world.sim_dir) == [kept]
    assert world.row(gone).state == "deleted"


def test_a_machine_of_an_owner_this_ledger_never_heard_of_is_foreign_and_kept(world: World) -> None:
    stranger = "f" * 32  # another ledger's controller: no owners row here, no machine row
    deadline = time.time() + 3600
    name = world.machine(stranger, job="theirs", record=False, deadline=deadline)
    actions = world.sweep(grace_s=600.0)
    a = actions[name]
    assert (a.action, a.reason, a.owner, a.deadline, a.expires) == (
        "keep", "foreign owner", stranger[:8], float(int(deadline)), float(int(deadline)) + 600.0)
    assert sim_machines(world.sim_dir) == [name]
    listed = _cli(world)  # the plain listing says whose it is and when the deadline rule takes it
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if name in ln)
    assert "foreign owner ffffffff, deadline " in line
    assert "deleted from " in line
    assert sim_machines(world.sim_dir) == [name]


def test_sweep_owner_treats_that_owner_as_dead_after_saying_what_goes(world: World) -> None:
    stranger = "e" * 32
    theirs = world.machine(stranger, job="theirs", record=False)
    kept = world.machine(world.live, job="kept")
    dry = _cli(world, "--owner", stranger[:8], "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"{theirs}" in dry.stdout
    assert "would delete" in dry.stdout
    assert sorted(sim_machines(world.sim_dir)) == sorted([theirs, kept])
    real = _cli(world, "--owner", stranger[:8])
    assert real.returncode == 0, real.stderr
    said, _, done = real.stdout.partition("\n")
    assert said == f"treating {stranger[:8]} as dead: 1 machine(s) to delete or close"
    assert done.index("would delete") < done.index(" deleted ")  # the plan is printed before anything goes
    assert sim_machines(world.sim_dir) == [kept]
    bad = _cli(world, "--owner", "nothex!")
    assert (bad.returncode, bad.stderr.count("\n")) == (2, 1)
    assert bad.stderr.startswith("actor-run: --owner: expected 8 or 32 hex digits")
