"""Coalescer: calls that arrive while one batch runs in a worker thread go together in the next.

A provider simulated in-process (the sim cloud) changes its state under one lock. A thousand
deletes at once, each its own thread hop and lock, queued for seconds behind each other (the
thread's GIL hand-offs cost more than the file work: bench/RESULTS.md). Batched, a task of the
batch runs everything queued so far in one thread hop, under one lock, while callers wait for
their own answer. A call answers with its own result, or raises its own exception.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import trio

from actor_run.protocols.failures import InternalError
from actor_run.protocols.offload import to_thread

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "due", "item", "result", "state")

    def __init__(self, item: T, due: float) -> None:
        self.item = item
        self.due = due
        self.done = trio.Event()
        self.result: R | BaseException | None = None
        self.state = 0  # 0 queued, 1 taken into a batch (the change may happen), 2 dropped (its caller left)


class Coalescer(Generic[T, R]):
    """`await batch(item)`: `run_many(items)` runs in a thread and answers one result per item, in
    order (an exception in the list is raised to that item's caller).

    `delay_s`: each item goes into a batch only `delay_s` after it was asked for (a provider's
    latency, as the sim plays it). One timer for the batch, not a trio sleep per caller: a sleep is
    a cancel scope, a deadline in trio's heap and a wake-up each, and a thousand deletes at once
    paid them a thousand times on the reactor while every other delete waited (item 38). A caller
    cancelled while its item still waits takes it back (nothing happened); once its batch has it,
    the caller waits for the answer (the change may have happened), then is cancelled."""

    def __init__(self, run_many: Callable[[list[T]], Sequence[R | BaseException]], delay_s: float = 0.0) -> None:
        self._run_many = run_many
        self._delay_s = delay_s
        self._pending: collections.deque[_Slot[T, R]] = collections.deque()  # in `due` order: one delay for all
        self._running = False

    async def __call__(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item, trio.current_time() + self._delay_s)
        self._pending.append(slot)
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run)
        try:
            await slot.done.wait()
        except trio.Cancelled:
            if slot.state == 0:  # not asked yet: it never will be
                slot.state = 2
                raise
            # shielded, as a thread call is: once asked, the change may happen, so its answer is
            # waited for (a cancelled create must not race the delete that follows it)
            with trio.CancelScope(shield=True):
                await slot.done.wait()
            raise
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result  # type: ignore[return-value]

    def _take_due(self) -> list[_Slot[T, R]]:
        now, pending, batch = trio.current_time(), self._pending, []
        while pending and pending[0].due <= now:
            slot = pending.popleft()
            if slot.state == 0:
                slot.state = 1
                batch.append(slot)
        return batch

    async def _run(self) -> None:
        """A task of its own, so no caller waits for batches after its own."""
        try:
            while self._pending:
                first = self._pending[0]
                if first.state == 2:
                    self._pending.popleft()
                    continue
                if first.due > trio.current_time():
                    await trio.sleep_until(first.due)  # a system task: cancelled only as the run ends
                batch = self._take_due()
                if not batch:
                    continue
                try:
                    # shielded: the change is made whatever happens, so its answers are kept for the
                    # callers (who wait shielded too) even while the reactor is stopping
                    with trio.CancelScope(shield=True):
                        results = await to_thread(self._run_many, [s.item for s in batch])
                    if len(results) != len(batch):
                        raise InternalError(f"{len(results)} answers for a batch of {len(batch)}")
                except Exception as exc:  # the batch itself failed: every caller hears it
                    results = [exc] * len(batch)
                for s, r in zip(batch, results, strict=True):
                    s.result = r
                    s.done.set()
        finally:
            self._running = False
