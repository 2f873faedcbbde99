"""Batch: calls that arrive while one batch runs in a worker thread go together in the next.

A provider simulated in-process (the sim cloud) changes its state under one lock. A thousand
deletes at once, each its own thread hop and lock, queued for seconds behind each other (the
thread's GIL hand-offs cost more than the file work: bench/RESULTS.md). Batched, a task of the
batch runs everything queued so far in one thread hop, under one lock, while callers wait for
their own answer. A call answers with its own result, or raises its own exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import trio

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("done", "item", "result")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = trio.Event()
        self.result: R | BaseException | None = None


class Batch(Generic[T, R]):
    """`await batch(item)`: `run_many(items)` runs in a thread and answers one result per item, in
    order (an exception in the list is raised to that item's caller)."""

    def __init__(self, run_many: Callable[[list[T]], Sequence[R | BaseException]]) -> None:
        self._run_many = run_many
        self._pending: list[_Slot[T, R]] = []
        self._running = False

    async def __call__(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        self._pending.append(slot)
        if not self._running:
            self._running = True
            trio.lowlevel.spawn_system_task(self._run)
        # shielded, as a thread call is: once asked, the change may happen, so its answer is waited
        # for (a cancelled create must not race the delete that follows it); the cancel comes after
        with trio.CancelScope(shield=True):
            await slot.done.wait()
        await trio.lowlevel.checkpoint_if_cancelled()
        if isinstance(slot.result, BaseException):
            raise slot.result
        return slot.result  # type: ignore[return-value]

    async def _run(self) -> None:
        """A task of its own, so no caller waits for batches after its own."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    # shielded: the change is made whatever happens, so its answers are kept for the
                    # callers (who wait shielded too) even while the reactor is stopping
                    with trio.CancelScope(shield=True):
                        results = await trio.to_thread.run_sync(self._run_many, [s.item for s in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"{len(results)} answers for a batch of {len(batch)}")
                except Exception as exc:  # the batch itself failed: every caller hears it
                    results = [exc] * len(batch)
                for s, r in zip(batch, results, strict=True):
                    s.result = r
                    s.done.set()
        finally:
            self._running = False
