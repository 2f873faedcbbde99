"""The reactor (actors/runtime.py): spawn, call, cancel, timers, its asyncio loop beside it, stop, statistics."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import outcome
import pytest
import trio
import trio.lowlevel

from actor_run.actors import Reactor, ReactorStatistics
from actor_run.protocols.failures import CallCancelled, ReactorError
from actor_run.protocols.hosts.aio import current_asyncio_loop


class Done:
    """An `on_done` callback that hands the outcome (and whether it ran on the reactor) to a future."""

    def __init__(self, reactor: Reactor) -> None:
        self.reactor = reactor
        self.future: concurrent.futures.Future[outcome.Outcome[Any]] = concurrent.futures.Future()
        self.on_reactor: bool | None = None

    def __call__(self, result: outcome.Outcome[Any]) -> None:
        self.on_reactor = self.reactor.in_reactor
        self.future.set_result(result)

    def get(self, timeout: float = 10.0) -> outcome.Outcome[Any]:
        return self.future.result(timeout)


@pytest.fixture
def hold(reactor: Reactor) -> Iterator[Callable[[], threading.Event]]:
    """Hold the reactor thread still (inside an on_done callback) until the returned event is set:
    whatever is spawned meanwhile cannot begin. Released at teardown at the latest."""
    gates: list[threading.Event] = []

    def make() -> threading.Event:
        gate, entered = threading.Event(), threading.Event()

        async def noop() -> None:
            pass

        def block(_: outcome.Outcome[None]) -> None:
            entered.set()
            gate.wait(10)

        reactor.spawn(noop, on_done=block)
        assert entered.wait(10)
        gates.append(gate)
        return gate

    yield make
    for g in gates:
        g.set()


def test_spawn_hands_the_value_to_on_done_on_the_reactor_thread(reactor: Reactor) -> None:
    async def answer(a: int, b: int) -> int:
        await trio.lowlevel.checkpoint()
        return a * b

    done = Done(reactor)
    task = reactor.spawn(answer, 6, 7, on_done=done)
    result = done.get()
    assert result == outcome.Value(42)
    assert done.on_reactor is True
    assert task.done
    assert task.name == "answer"


def test_spawn_hands_an_exception_to_on_done(reactor: Reactor) -> None:
    async def broken() -> None:
        await trio.lowlevel.checkpoint()
        raise ValueError("boom")

    done = Done(reactor)
    reactor.spawn(broken, on_done=done)
    result = done.get()
    assert isinstance(result, outcome.Error)
    assert isinstance(result.error, ValueError)
    assert str(result.error) == "boom"


def test_call_returns_the_coroutines_value(reactor: Reactor) -> None:
    async def add(a: int, b: int) -> int:
        await trio.lowlevel.checkpoint()
        return a + b

    assert reactor.call(add, 2, 3) == 5
    assert reactor.call(add, 2, 3, timeout=10) == 5


def test_call_raises_the_coroutines_exception(reactor: Reactor) -> None:
    async def broken() -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        reactor.call(broken)


def test_call_that_runs_out_of_time_raises_call_cancelled_and_cancels_the_coroutine(reactor: Reactor) -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise

    with pytest.raises(CallCancelled, match="did not finish within"):
        reactor.call(forever, timeout=0.2)
    assert started.is_set()
    assert cancelled.wait(10), "the coroutine of a timed-out call was not cancelled"


def test_a_call_cut_short_by_stop_raises_call_cancelled_never_returns_none() -> None:
    reactor = Reactor(name="reactor-stopped-mid-call").start()
    started = threading.Event()
    answer: queue.Queue[object] = queue.Queue()

    async def forever() -> str:
        started.set()
        await trio.sleep_forever()
        return "never"

    def caller() -> None:
        try:
            answer.put(reactor.call(forever))
        except CallCancelled as exc:
            answer.put(exc)

    thread = threading.Thread(target=caller, name="caller")
    thread.start()
    try:
        assert started.wait(10)
    finally:
        reactor.stop()
        thread.join(10)
    got = answer.get(timeout=0)
    assert isinstance(got, CallCancelled), f"a cancelled call returned {got!r}"


def test_cancel_before_the_task_begins_ends_it_with_call_cancelled(
    reactor: Reactor, hold: Callable[[], threading.Event],
) -> None:
    ran = threading.Event()

    async def body() -> str:
        await trio.lowlevel.checkpoint()
        ran.set()
        return "ran"

    gate = hold()  # the reactor cannot begin the task until the gate opens
    done = Done(reactor)
    task = reactor.spawn(body, on_done=done)
    task.cancel()
    gate.set()
    result = done.get()
    assert isinstance(result, outcome.Error)
    assert isinstance(result.error, CallCancelled)
    assert not ran.is_set()
    assert task.done


def test_cancel_after_the_task_began_ends_it_with_call_cancelled(reactor: Reactor) -> None:
    started = threading.Event()

    async def body() -> None:
        started.set()
        await trio.sleep_forever()

    done = Done(reactor)
    task = reactor.spawn(body, on_done=done)
    assert started.wait(10)
    task.cancel()
    result = done.get()
    assert isinstance(result, outcome.Error)
    assert isinstance(result.error, CallCancelled)
    assert "was cancelled" in str(result.error)


def test_cancel_after_the_task_ended_changes_nothing(reactor: Reactor) -> None:
    async def quick() -> int:
        return 1

    done = Done(reactor)
    task = reactor.spawn(quick, on_done=done)
    assert done.get() == outcome.Value(1)
    task.cancel()  # safe at any time
    assert task.done
    assert reactor.call(quick) == 1  # the reactor is unharmed


def test_call_later_fires_once(reactor: Reactor) -> None:
    fired: queue.Queue[str] = queue.Queue()
    reactor.call_later(0.05, lambda: fired.put("timer"))
    reactor.call_later(0.4, lambda: fired.put("sentinel"))
    assert fired.get(timeout=10) == "timer"
    # by the sentinel the first timer had eight times its delay to fire again
    assert fired.get(timeout=10) == "sentinel"
    assert fired.empty()


def test_call_later_does_not_fire_after_cancel(reactor: Reactor) -> None:
    fired: queue.Queue[str] = queue.Queue()
    timer = reactor.call_later(0.2, lambda: fired.put("cancelled timer"))
    timer.cancel()
    reactor.call_later(0.5, lambda: fired.put("sentinel"))
    assert fired.get(timeout=10) == "sentinel"
    assert fired.empty()
    assert timer.done


def test_pending_timers_are_no_tasks_and_fire_in_due_order(reactor: Reactor) -> None:
    """A thousand pending timers are entries in one heap (no trio task each: the collector walks
    about 25 objects per sleeping task); one added later but due sooner fires first."""
    fired: queue.Queue[str] = queue.Queue()
    far = [reactor.call_later(600.0, lambda: fired.put("far")) for _ in range(1000)]
    reactor.call_later(0.3, lambda: fired.put("second"))
    reactor.call_later(0.05, lambda: fired.put("first"))
    assert fired.get(timeout=10) == "first"
    assert fired.get(timeout=10) == "second"
    assert reactor.statistics().tasks_running == 0
    for timer in far:
        timer.cancel()
    done = threading.Event()
    reactor.call_later(0.0, done.set)  # after every cancel above (the reactor takes them in order)
    assert done.wait(10)
    assert all(t.done for t in far)
    assert fired.empty()


def test_timers_pending_at_stop_are_done_without_firing() -> None:
    reactor = Reactor().start()
    fired = threading.Event()
    timer = reactor.call_later(600.0, fired.set)
    assert reactor.call(trio.lowlevel.checkpoint) is None  # the timer is in the heap by now
    reactor.stop()
    assert timer.done
    assert not fired.is_set()


def test_call_later_runs_its_callback_on_the_reactor_thread(reactor: Reactor) -> None:
    where: queue.Queue[bool] = queue.Queue()
    reactor.call_later(0.0, lambda: where.put(reactor.in_reactor))
    assert where.get(timeout=10) is True


def test_call_from_the_reactor_thread_is_refused(reactor: Reactor) -> None:
    async def one() -> int:
        return 1

    seen: queue.Queue[BaseException | int] = queue.Queue()

    def nested(_: outcome.Outcome[int]) -> None:
        try:
            seen.put(reactor.call(one, timeout=1))
        except ReactorError as exc:
            seen.put(exc)

    reactor.spawn(one, on_done=nested)
    got = seen.get(timeout=10)
    assert isinstance(got, ReactorError)
    assert "deadlock" in str(got)


def test_an_asyncio_coroutine_runs_inside_a_spawned_task(reactor: Reactor) -> None:
    async def in_asyncio(x: int) -> tuple[int, bool]:
        await asyncio.sleep(0.01)
        return x + 1, asyncio.get_running_loop() is not None

    async def from_trio() -> tuple[int, bool]:
        answer: tuple[int, bool] = await current_asyncio_loop().run(in_asyncio, 41)
        return answer

    done = Done(reactor)
    reactor.spawn(from_trio, on_done=done)
    assert done.get() == outcome.Value((42, True))


def test_an_asyncio_coroutine_runs_through_call_with_the_loop_given(reactor: Reactor) -> None:
    async def in_asyncio() -> str:
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, "asyncio answered")
        answer: str = await fut
        return answer

    loop = reactor.asyncio_loop
    assert loop is not None

    async def from_trio() -> str:
        answer: str = await loop.run(in_asyncio)
        return answer

    assert reactor.call(from_trio, timeout=10) == "asyncio answered"


def test_stop_joins_the_thread() -> None:
    reactor = Reactor(name="reactor-under-stop").start()
    assert reactor.running
    assert any(t.name == "reactor-under-stop" for t in threading.enumerate())
    assert any(t.name == "reactor-under-stop-asyncio" for t in threading.enumerate())
    reactor.stop()
    assert not reactor.running
    assert not any(t.name.startswith("reactor-under-stop") for t in threading.enumerate())
    reactor.stop()  # a second stop is harmless


def test_the_asyncio_loop_stops_after_the_tasks_that_use_it() -> None:
    """A task's shielded cleanup on the way out still reaches the asyncio loop (SSH channels close
    there as the reactor stops)."""
    reactor = Reactor(name="reactor-aio-order").start()
    started = threading.Event()
    cleaned: queue.Queue[object] = queue.Queue()

    async def forever() -> None:
        try:
            started.set()
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                cleaned.put(await current_asyncio_loop().run(asyncio.sleep, 0, "cleaned"))

    reactor.spawn(forever)
    assert started.wait(10)
    reactor.stop()
    assert cleaned.get(timeout=1) == "cleaned"


def test_stop_cancels_what_still_runs() -> None:
    reactor = Reactor(name="reactor-with-work").start()
    started = threading.Event()

    async def forever() -> None:
        started.set()
        await trio.sleep_forever()

    done = Done(reactor)
    try:
        reactor.spawn(forever, on_done=done)
        assert started.wait(10)
    finally:
        reactor.stop()
    result = done.get(timeout=0)  # stop() returned after the task ended
    assert isinstance(result, outcome.Error)
    assert isinstance(result.error, CallCancelled)


def test_spawn_and_call_after_stop_raise_call_cancelled_every_time() -> None:
    """Not only the first: a reactor that has stopped refuses every later call at once (a call that
    waited for its timeout instead would hang a lease's stop hook for delete_timeout_s + 30 s)."""
    reactor = Reactor(name="reactor-stopped").start()
    reactor.stop()

    async def one() -> int:
        return 1

    for _ in range(3):
        with pytest.raises(CallCancelled, match="stopped"):
            reactor.spawn(one)
        with pytest.raises(CallCancelled, match="stopped"):
            reactor.call(one, timeout=5)
    with pytest.raises(CallCancelled, match="stopped"):
        reactor.call_later(0.0, lambda: None)


def test_statistics_count_tasks_and_timers(reactor: Reactor) -> None:
    assert reactor.statistics() == ReactorStatistics(tasks_started=0, tasks_running=0, timers_started=0)
    both_started = threading.Barrier(3, timeout=10)

    async def forever() -> None:
        await trio.to_thread.run_sync(both_started.wait)
        await trio.sleep_forever()

    dones = [Done(reactor), Done(reactor)]
    tasks = [reactor.spawn(forever, on_done=d) for d in dones]
    both_started.wait()
    stats = reactor.statistics()
    assert stats.tasks_started == 2
    assert stats.tasks_running == 2
    assert stats.timers_started == 0

    fired = threading.Event()
    reactor.call_later(0.0, fired.set)
    assert fired.wait(10)
    stats = reactor.statistics()
    assert stats.timers_started == 1
    assert stats.tasks_started == 2  # a timer is no task: an entry in the timers' heap
    assert stats.tasks_running == 2

    for t in tasks:
        t.cancel()
    for d in dones:
        d.get()
    assert reactor.statistics() == ReactorStatistics(tasks_started=2, tasks_running=0, timers_started=1)
    with pytest.raises(AttributeError):
        stats.tasks_started = 0  # type: ignore[misc]  # frozen
