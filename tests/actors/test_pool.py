"""The actor pool (actors/pool.py): a tell put off until idle goes out once no turn waits, and is
never put off for more than LATER_EVERY turns; an urgent message's turn goes first; a reactor
wake-up put off by a turn goes out before its worker blocks."""

from __future__ import annotations

from typing import Any

import pykka

from actor_run.actors.flag import Flag
from actor_run.actors.pool import LATER_EVERY, POOL, PooledActor, blocking
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
            case "later":
                self.log.append("later")
        return None


def play(rounds: int, later: bool = True) -> list[str]:
    """A rally of `rounds` turns with a tell put off until idle from the start (unless not `later`);
    the order things happened in (each a turn on the pool)."""
    log: list[str] = []
    done = Flag()
    a = Player.start(log, done, rounds)
    b = Player.start(log, done, rounds)
    try:
        a.tell(("other", b))
        b.tell(("other", a))
        a.tell(("ball", 1))
        if later:
            POOL.when_idle(b, "later")
        assert done.wait(10)
        for _ in range(500 if later else 0):  # bounded: the put-off tell goes out once the rally is over
            if "later" in log:
                break
            done.wait(0.01)
        return log
    finally:
        a.stop()
        b.stop()


def test_a_tell_put_off_until_idle_waits_for_the_turns_queued_before_it() -> None:
    play(rounds=2 * LATER_EVERY, later=False)  # a pool with a history: its turns count for no later tell
    log = play(rounds=LATER_EVERY // 2)
    assert log.index("later") == len(log) - 1  # after every turn of the rally
    assert log.count("turn") == LATER_EVERY // 2


def test_a_tell_put_off_until_idle_goes_out_within_later_every_turns_under_load() -> None:
    log = play(rounds=4 * LATER_EVERY)
    at = log.index("later")
    assert at < len(log) - 1  # the rally was still on
    assert at <= LATER_EVERY + 2  # not put off for more than LATER_EVERY turns


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
        for _ in range(1000):  # bounded: until all 51 turns ran
            if len(log) == 51:
                break
            done.wait(0.01)
        assert len(log) == 51
        assert log[0] == "u:Cancel"  # told last, handled first
        assert sorted(log[1:]) == sorted(f"r{i}:str" for i in range(50))
    finally:
        for ref in [*routine, urgent, kicker]:
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
    registry exactly while it lives."""
    formatted: list[str] = []

    class Counted(Player):
        def __str__(self) -> str:
            formatted.append("actor")
            return super().__str__()

    caplog.set_level("DEBUG", logger="pykka")
    refs = [Counted.start([], Flag(), 1) for _ in range(20)]
    assert all(ref in pykka.ActorRegistry.get_all() for ref in refs)
    for ref in refs:
        ref.stop()
    assert not any(ref in pykka.ActorRegistry.get_all() for ref in refs)
    assert not any(ref.is_alive() for ref in refs)
    assert formatted == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("pykka")] == []
