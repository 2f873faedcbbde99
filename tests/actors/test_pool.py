"""The actor pool (actors/pool.py): an urgent message's turn goes first; a reactor wake-up put off by
a turn goes out before its worker blocks; actors start and stop without pykka's debug lines; an idle
child stops in its parent's turn."""

from __future__ import annotations

import threading
from typing import Any, cast

import pykka
import pytest
from actor_kit import wait_until

from actor_run.actors.base import Actor, Context
from actor_run.actors.flag import Flag
from actor_run.actors.pool import POOL, PooledActor, blocking, live_actors
from actor_run.actors.runtime import Reactor
from actor_run.protocols.messages import Cancel


class Player(PooledActor):
    """Ping-pong: each message is a turn of its own (the other player is told, not this one)."""

    def __init__(self, log: list[str], done: Flag, rounds: int) -> None:
        super().__init__()
        self.log, self.done, self.rounds = log, done, rounds
        self.other: pykka.ActorRef[Any] | None = None

    def on_receive(self, message: Any) -> Any:
        match message:
            case ("other", ref):
                self.other = ref
            case ("ball", n):
                self.log.append("turn")
                if n >= self.rounds:
                    self.done.set()
                elif self.other is not None:
                    self.other.tell(("ball", n + 1))
        return None


class Recorder(PooledActor):
    """Notes each message it handles in a log shared with the others."""

    def __init__(self, log: list[str], name: str) -> None:
        super().__init__()
        self.log, self.name = log, name

    def on_receive(self, message: Any) -> Any:
        self.log.append(f"{self.name}:{type(message).__name__}")
        return None


class Kicker(PooledActor):
    """In one turn: a routine message to each of `routine`, then an urgent one to `urgent`."""

    def __init__(self, routine: list[pykka.ActorRef[Any]], urgent: pykka.ActorRef[Any], done: Flag) -> None:
        super().__init__()
        self.routine, self.urgent, self.done = routine, urgent, done

    def on_receive(self, message: Any) -> Any:
        for ref in self.routine:
            ref.tell("routine")
        self.urgent.tell(Cancel())
        self.done.set()
        return None


def test_an_urgent_message_is_handled_before_the_routine_turns_queued_before_it() -> None:
    """A `Cancel` (or `Release`: `Message.urgent`) puts its actor's turn at the front of the pool's
    queue: cancelling thousands of running jobs, each step on the way to a delete no longer waits
    behind every poll report and stop queued before it."""
    log: list[str] = []
    routine = [Recorder.start(log, f"r{i}") for i in range(50)]
    urgent = Recorder.start(log, "u")
    done = Flag()
    kicker = Kicker.start(routine, urgent, done)
    try:
        for ref in [*routine, urgent]:  # each has had its first turn (on_start): idle now
            ref.ask("ready", timeout=10)
        log.clear()
        kicker.tell("go")
        assert done.wait(10)
        # `done` is set already: waiting on it paused nothing, so the look was a spin of a moment
        wait_until(lambda: len(log) >= 51, what="all 51 turns ran")
        assert len(log) == 51
        assert log[0] == "u:Cancel"  # told last, handled first
        assert sorted(log[1:]) == sorted(f"r{i}:str" for i in range(50))
    finally:
        for ref in [*routine, urgent, kicker]:
            ref.stop()


class Teller(PooledActor):
    """In one turn: `n` messages to `many`, then one to `one`."""

    def __init__(self, many: pykka.ActorRef[Any], n: int, one: pykka.ActorRef[Any], done: Flag) -> None:
        super().__init__()
        self.many, self.n, self.one, self.done = many, n, one, done

    def on_receive(self, message: Any) -> Any:
        for i in range(self.n):
            self.many.tell(i)
        self.one.tell("one")
        self.done.set()
        return None


class Greedy(Recorder):
    burst = 100


@pytest.mark.parametrize(("kind", "first_run"), [(Recorder, 32), (Greedy, 64)])
def test_an_actor_handles_up_to_its_burst_of_messages_a_turn(kind: type[Recorder], first_run: int) -> None:
    """32 messages a turn (the pool's fairness), then the actor waits behind the turns queued meanwhile;
    an actor class may say more (the batch supervisor: one message starts or ends one job)."""
    log: list[str] = []
    many, one = kind.start(log, "m"), Recorder.start(log, "o")
    done = Flag()
    teller = Teller.start(many, 64, one, done)
    try:
        for ref in (many, one):  # each has had its first turn (on_start): idle now
            ref.ask("ready", timeout=10)
        log.clear()
        teller.tell("go")
        assert done.wait(10)
        # `done` is set already: waiting on it paused nothing, so the look was a spin of a moment
        wait_until(lambda: len(log) >= 65, what="all 65 messages were handled")
        assert len(log) == 65
        assert log.index("o:str") == first_run  # the other actor's turn came after `first_run` of them
    finally:
        for ref in (many, one, teller):
            ref.stop()


class Spawner(PooledActor):
    """Spawns a reactor task and waits for it in the same turn (inside `blocking()`)."""

    def __init__(self, reactor: Reactor) -> None:
        super().__init__()
        self.reactor = reactor

    def on_receive(self, message: Any) -> Any:
        async def quick() -> int:
            return 7

        task = self.reactor.spawn(quick)
        with blocking():  # the reactor's wake-up, put off to the end of the worker's turns, goes out here
            return task.wait_finished(10)


def test_a_wake_up_put_off_by_a_turn_goes_out_before_the_worker_blocks() -> None:
    reactor = Reactor().start()
    spawner = Spawner.start(reactor)
    try:
        assert spawner.ask("go", timeout=20) is True
    finally:
        spawner.stop()
        reactor.stop()


def test_starting_and_stopping_an_actor_formats_no_debug_line(caplog: Any) -> None:
    """pykka's `start`, `register`, `unregister` and `_stop` each format a debug line naming the actor
    whether or not anything shows it: four per actor, six actors per attempt (bench/RESULTS.md,
    item 53). A pooled actor starts, registers, stops and unregisters without them, and is in the
    `live_actors()` exactly while it lives (pykka's registry is the host's)."""
    formatted: list[str] = []

    class Counted(Player):
        def __str__(self) -> str:
            formatted.append("actor")
            return super().__str__()

    caplog.set_level("DEBUG", logger="pykka")
    refs = [Counted.start([], Flag(), 1) for _ in range(20)]
    assert all(ref in live_actors() for ref in refs)
    assert not any(ref in pykka.ActorRegistry.get_all() for ref in refs)  # the host's registry: not ours
    for ref in refs:
        ref.stop()
    assert not any(ref in live_actors() for ref in refs)
    assert not any(ref.is_alive() for ref in refs)
    assert formatted == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pykka")] == []


class Child(Actor):
    """Notes, as it stops, whether its parent's turn was under way and on which thread it stopped."""

    def __init__(self, seen: dict[str, Any], gate: Flag | None = None) -> None:
        super().__init__(cast(Context, None), None, "child")
        self.seen, self.gate = seen, gate

    def handle(self, message: Any) -> Any:
        self.seen.setdefault("handled", []).append(message)
        if message == "hold" and self.gate is not None:
            with blocking():  # a turn that waits says so (as the product's waits do): the pool lends a worker
                assert self.gate.wait(10)
        return None

    def on_stop(self) -> None:
        self.seen["stopped_in_parents_turn"] = self.seen.get("parent_turn", False)
        self.seen["stopped_on"] = threading.get_ident()


class Parent(Actor):
    def __init__(self, seen: dict[str, Any], child: pykka.ActorRef[Any]) -> None:
        super().__init__(cast(Context, None), None, "parent")
        self.seen, self.child = seen, child

    def handle(self, message: Any) -> Any:
        if message == "stop the child":
            self.seen["parent_turn"], self.seen["parent_on"] = True, threading.get_ident()
            self.stop_soon(self.child)
            self.seen["parent_turn"] = False
            return self.child.is_alive()
        if message == "end":
            self.stop_now()
            return self.actor_ref.is_alive()
        return None


def test_an_idle_child_is_stopped_in_its_parents_turn_without_a_turn_of_its_own() -> None:
    """`stop_soon` on an idle child runs its stop in the parent's turn, on the parent's thread: no
    tell, no wake-up, no turn of the child's (bench/RESULTS.md, item 63: six stops per attempt at its
    end were a turn each). Before: told `_ActorStop`, stopped in a turn of its own after the parent's."""
    seen: dict[str, Any] = {}
    child = Child.start(seen)
    parent = Parent.start(seen, child)
    try:
        child.ask("ready", timeout=10)  # its first turn has run: idle
        turns = POOL.statistics()["turns"]
        assert parent.ask("stop the child", timeout=10) is False  # stopped before the parent's turn ended
        assert seen["stopped_in_parents_turn"] is True
        assert seen["stopped_on"] == seen["parent_on"]
        assert not child.is_alive()
        assert child not in live_actors()
        assert POOL.statistics()["turns"] - turns == 1  # the parent's (the ask), none of the child's
        with pytest.raises(pykka.ActorDeadError):
            child.tell("late")
    finally:
        parent.stop()


def test_a_busy_child_is_told_to_stop_after_what_its_inbox_holds() -> None:
    """A child in a turn (or with messages waiting) is not stopped under its feet: told `_ActorStop`,
    it handles what came before it, then stops in a turn of its own."""
    seen: dict[str, Any] = {}
    gate = Flag()
    child = Child.start(seen, gate)
    parent = Parent.start(seen, child)
    try:
        child.ask("ready", timeout=10)
        child.tell("hold")  # its turn waits on the gate
        for _ in range(1000):  # bounded: until its turn is under way
            if seen.get("handled", [])[-1:] == ["hold"]:
                break
            gate.wait(0.01)
        child.tell("queued")
        assert parent.ask("stop the child", timeout=10) is True  # told, not stopped yet
        gate.set()
        pause = Flag()
        for _ in range(1000):  # bounded
            if not child.is_alive():
                break
            pause.wait(0.01)
        assert not child.is_alive()
        assert seen["handled"] == ["ready", "hold", "queued"]
        assert seen["stopped_in_parents_turn"] is False
    finally:
        parent.stop()
        gate.set()


def test_an_actor_that_told_its_end_stops_within_that_turn() -> None:
    """`stop_now`: stopped as its turn ends, not by a put-off `_ActorStop` of its own later (a tell
    and a turn more per lease, attempt and job at an attempt's end; item 63)."""
    seen: dict[str, Any] = {}
    child = Child.start(seen)
    parent = Parent.start(seen, child)
    try:
        child.ask("ready", timeout=10)
        parent.ask("ready", timeout=10)
        turns = POOL.statistics()["turns"]
        assert parent.ask("end", timeout=10) is False
        assert not parent.is_alive()
        assert POOL.statistics()["turns"] - turns == 1
    finally:
        child.stop()
