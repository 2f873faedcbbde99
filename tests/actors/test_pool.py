"""The actor pool (actors/pool.py): a tell put off until idle goes out once no turn waits, and is
never put off for more than LATER_EVERY turns."""

from __future__ import annotations

from typing import Any

import pykka

from actor_run.actors.flag import Flag
from actor_run.actors.pool import LATER_EVERY, POOL, PooledActor


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
