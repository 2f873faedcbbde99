"""actors/flag.py: an Event's set / is_set / wait, with the Event made only for a waiter."""

from __future__ import annotations

import threading
import time

from actor_run.actors.flag import Flag


def test_a_flag_set_before_a_wait_answers_at_once() -> None:
    f = Flag()
    assert not f.is_set()
    f.set()
    assert f.is_set()
    assert f.wait(0) is True


def test_a_wait_times_out_while_unset() -> None:
    f = Flag()
    t = time.monotonic()
    assert f.wait(0.05) is False
    assert time.monotonic() - t >= 0.04
    assert not f.is_set()


def test_a_set_from_another_thread_wakes_every_waiter() -> None:
    f = Flag()
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(f.wait(10))) for _ in range(4)]
    for w in waiters:
        w.start()
    # not a wait for a condition (a thread blocked in wait cannot be observed): a head start so that
    # most waiters are in wait when set() comes; either way each must see the set
    time.sleep(0.05)
    f.set()
    for w in waiters:
        w.join(5)
    assert woke == [True] * 4
