"""What the ledger's writer thread is handed: its queue (`_WriteQueue`), the Waiter that says when a
write is durable, and the `FileWrite` a shared ledger's fence guards (core.py runs them)."""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from actor_run.actors.base import failure_text
from actor_run.actors.flag import Flag
from actor_run.actors.pool import blocking
from actor_run.protocols.logs import logger
from actor_run.supervisors.ledger.db import Conn, LedgerError

T = TypeVar("T")


class StaleClaim(LedgerError):
    """This controller no longer holds the job (its lease expired, another controller claimed it):
    the write was not made, and the job is no longer this controller's to touch."""


class FileWrite:
    """A write of a job's files (its log, its response.json) that the ledger's fence guards: on a
    shared ledger it runs on the writer thread just after the transaction that proved the claim
    commits (`LedgerCore.write_file`), never inside it and never twice."""

    __slots__ = ("write",)

    def __init__(self, write: Callable[[], object]) -> None:
        self.write = write

    def __call__(self, conn: Conn) -> None:  # not SQL: run after the commit (`_after_commit`)
        return None


class _ConnectionLost(Exception):
    """The server ended the session mid-transaction (a restart, a failover, a cut network, or a
    transaction left idle past the server's limit while this process was frozen)."""


class Waiter:
    """One queued write: `done` is set once it is committed (or failed: `error`). `when_done(fn)`
    calls `fn(error)` then, on the writer thread (at once, on the caller's, if it already is): `fn`
    must only hand the news on, never wait on the ledger."""

    __slots__ = ("_callbacks", "_lock", "done", "error")

    def __init__(self) -> None:
        self.done = Flag()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[BaseException | None], None]] = []

    def when_done(self, fn: Callable[[BaseException | None], None]) -> None:
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(fn)
                return
        fn(self.error)

    def wait(self, timeout: float = 60.0) -> None:
        """Return once the write is durable; raise LedgerError if it failed or took too long."""
        with blocking():
            committed = self.done.wait(timeout)
        if not committed:
            raise LedgerError(f"the ledger did not commit within {timeout:g} s")
        if isinstance(self.error, StaleClaim):
            raise StaleClaim(str(self.error))
        if self.error is not None:
            raise LedgerError(f"the ledger could not record it: {self.error}") from self.error

    def finish(self) -> None:
        with self._lock:
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self.error)
            except Exception:  # one bad callback must not kill the writer thread
                logger.bind(traceback=True).error("a ledger commit callback failed:\n{}",
                                                  failure_text(*sys.exc_info()))


class _WriteQueue(Generic[T]):
    """The writer thread's queue: a put wakes the writer only when it sleeps (queue.Queue takes a
    Condition and notifies on every put: about twenty Python calls, five writes per attempt)."""

    def __init__(self) -> None:
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()  # released once per sleep, by the put that ends it
        self._sleeping = False

    def put(self, item: T, *, first: bool = False) -> None:
        """Queue `item` last, or with `first` ahead of every item waiting (the next `take` returns it first)."""
        with self._lock:
            if first:
                self._items.appendleft(item)
            else:
                self._items.append(item)
            wake, self._sleeping = self._sleeping, False
        if wake:
            self._wake.release()

    def take(self, most: int) -> list[T]:
        """Up to `most` items, oldest first; blocks while there are none."""
        while True:
            with self._lock:
                items = self._items
                if items:
                    n = min(most, len(items))
                    return [items.popleft() for _ in range(n)]
                self._sleeping = True
            self._wake.acquire()
