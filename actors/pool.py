"""PooledActor: a pykka actor type that runs on a shared pool of threads instead of a thread each.

Why (bench/RESULTS.md has the figures): with a thread per actor, an attempt costs five threads;
at a thousand attempts, starting them (about 0.7 ms each) and waking them for every message
(futex and GIL hand-offs: 400k context switches for 500 attempts) took more time than the jobs.
Actors spend their life idle in their inbox (DESIGN.md), so they need a turn on a thread only
when a message is waiting.

Semantics kept from pykka's ThreadingActor (pykka's own message loop, Envelope, ActorRef and
futures are used as they are; a pooled actor is listed by `live_actors()`, not in pykka's
ActorRegistry, which belongs to the host):
- one message at a time per actor, in the order they were put; `on_start` before the first;
- a raise in a `tell`ed message calls `on_failure` and stops the actor (no `on_stop`); a raise in
  an `ask`ed one goes back to the asker; `stop()` runs `on_stop`; messages left in the inbox of a
  stopped actor answer `ActorDeadError` to their askers.
What differs: hooks and handlers run on a pool worker (one at a time per actor), not on a thread
of the actor's own. A worker that is about to block (a future's `get`, `Reactor.call`, waiting for
the ledger) says so with `blocking()`; the pool then makes sure another worker is free, so actors
that wait on each other cannot starve the pool (ForkJoinPool's managed blocking).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import sys
import threading
import traceback as traceback_module
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pykka
from pykka import ActorDeadError
from pykka._envelope import Envelope  # pykka's own envelope: the same protocol as ThreadingActor
from pykka.messages import _ActorStop

from actor_run.actors.flag import Flag
from actor_run.protocols.logs import logger

BURST = 32  # messages one actor handles per turn before the worker moves on (fairness)
DEFER_TURNS = 32  # a wake-up put off by `defer` goes out after at most this many turns of its worker
_local = threading.local()
# a UUID's text whose last group counts up: random per process, unique in it, one format per actor
_URN_PREFIX = uuid.uuid4().urn[:-12]
_urns = itertools.count()


def _next_urn() -> str:
    return f"{_URN_PREFIX}{next(_urns) % (1 << 48):012x}"


class ActorPool:
    """Worker threads that take runnable actors from one queue, one running at a time. At least
    one worker is free for new work whenever some are blocked; idle workers beyond `keep` exit
    after `idle_s`, and every idle one at once while no reactor holds the pool (`hold`/`release`)."""

    def __init__(self, *, keep: int = 4, max_workers: int = 8192, idle_s: float = 5.0) -> None:
        self.keep, self.max_workers, self.idle_s = keep, max_workers, idle_s
        self._runnable: collections.deque[PooledActor] = collections.deque()
        self._cond = threading.Condition()
        self._workers = 0
        self._idle = 0
        self._blocked = 0
        self._ids = itertools.count()
        self._holders = 0  # running reactors (hold/release): with none, an idle worker ends at once
        self._threads: set[threading.Thread] = set()
        self.turns = 0
        self.messages = 0

    def schedule(self, actor: PooledActor, urgent: bool = False) -> None:
        """Queue an actor's turn. A worker is woken only when none is running: a running worker
        takes the next turn itself when it finishes one (under load, most puts wake nobody). One
        worker runs turns at a time, more only while some wait in `blocking()`: with the GIL, a
        second one running adds no CPU, only hand-offs that the reactor and the ledger's thread
        then wait for (at N=1000, 0.6-1.3 s less CPU and wall/ideal 1.052-1.070 against
        1.065-1.072 in 3 A/B pairs, with up to 32 queued turns per running worker before).

        `urgent` (a message on the way to deleting a machine: `Message.urgent`) puts the turn at
        the front, ahead of the routine ones (polls' reports, stops, events): cancelling 3,000
        running jobs queued each step of each job's way to its delete (job, attempt, lease)
        behind every turn the step before had queued, so no delete went out before most of the
        end's bookkeeping was done (bench/RESULTS.md, item 36). Front-first, a job's steps run one
        after the other and its delete goes out at once."""
        with self._cond:
            if urgent:
                self._runnable.appendleft(actor)
            else:
                self._runnable.append(actor)
            running = self._workers - self._idle - self._blocked
            if running > 0:
                return
            if self._idle > 0:
                self._cond.notify()
            else:
                self._spawn()

    def _spawn(self) -> None:
        if self._workers >= self.max_workers:
            return
        self._workers += 1
        t = threading.Thread(target=self._work, name=f"actor-run-pool-{next(self._ids)}", daemon=True)
        self._threads.add(t)
        t.start()

    def hold(self) -> None:
        """A reactor started (actors/runtime.py): up to `keep` idle workers wait `idle_s` for work."""
        with self._cond:
            self._holders += 1

    def release(self, timeout: float = 30.0) -> None:
        """A reactor stopped. With none left, idle workers end now and every worker is joined (a
        busy one once its turn ends, up to `timeout` s in all): a closed Runner leaves no thread.
        Any thread; a worker calling it does not wait for itself."""
        with self._cond:
            self._holders = max(0, self._holders - 1)
            if self._holders:
                return
            self._cond.notify_all()
            threads = [t for t in self._threads if t is not threading.current_thread()]
        for t in threads:
            t.join(timeout)

    def _work(self) -> None:
        _local.pool = self
        _local.deferred = {}
        _local.deferred_turns = 0
        while True:
            with self._cond:
                self._idle += 1
                while not self._runnable:
                    if _local.deferred:
                        # about to wait: the wake-ups this worker put off go out first (outside the lock: a
                        # wake may run what it woke for). After a turn another actor was runnable, so they
                        # were kept for the next turn; another worker took that actor: a reactor left
                        # unwoken, its `soon` calls queued behind a wake-up nobody sent (a Runner's close
                        # waited 30 s per cloud on a call the reactor never saw)
                        self._cond.release()
                        try:
                            _flush_deferred()
                        finally:
                            self._cond.acquire()
                        continue
                    if self._holders == 0 or (
                        not self._cond.wait(self.idle_s) and not self._runnable and self._workers > self.keep
                    ):
                        self._idle -= 1
                        self._workers -= 1
                        self._threads.discard(threading.current_thread())
                        return
                self._idle -= 1
                actor = self._runnable.popleft()
            self.turns += 1
            actor._turn()
            if _local.deferred:
                _local.deferred_turns += 1
                if _local.deferred_turns >= DEFER_TURNS or not self._runnable:
                    _flush_deferred()

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        _flush_deferred()  # what this worker will wait for may need them
        with self._cond:
            self._blocked += 1
            if self._idle == 0 and (self._runnable or self._workers - self._blocked < 1):
                self._spawn()
            elif self._runnable:
                self._cond.notify()  # turns queued while this worker ran woke nobody (schedule): wake one now
        try:
            yield
        finally:
            with self._cond:
                self._blocked -= 1

    def statistics(self) -> dict[str, int]:
        with self._cond:
            return {"workers": self._workers, "idle": self._idle, "blocked": self._blocked,
                    "turns": self.turns, "messages": self.messages}


POOL = ActorPool()


# The pooled actors that live, in start order. Not pykka's registry: that one is the host's (a
# program embedding us may run pykka actors of its own; importing us must not change its registry,
# nor its `ActorRegistry.stop_all()` stop a Runner's actors, whose leases must delete their
# machines). A dict: O(1) add and remove (pykka's list scans on each removal: 6,000 actors live at
# a thousand attempts). ActorRef hashes by identity (no __eq__ of its own).
_LIVE: dict[pykka.ActorRef[Any], None] = {}
_LIVE_LOCK = threading.Lock()


def live_actors() -> list[pykka.ActorRef[Any]]:
    """Every pooled actor that lives now (started, not yet stopped), in start order. Any thread."""
    with _LIVE_LOCK:
        return list(_LIVE)


def _unregister(ref: pykka.ActorRef[Any]) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(ref, None)


def defer(wake: Callable[[], None]) -> bool:
    """On a pool worker: call `wake` (once, however often it is deferred) after this worker's run of
    turns: when its queue is empty, before it blocks, or after DEFER_TURNS turns. False off the
    workers (the caller calls it itself). For the reactor's wake-up (a write to its socket, which
    wakes its thread: actors/runtime.py): cancelling 3,000 jobs, each lease's delete woke the reactor
    on its own, a system call and a thread switch each, 28 % of the worker's time (item 37); now a
    run of turns wakes it once."""
    deferred: dict[Callable[[], None], None] | None = getattr(_local, "deferred", None)
    if deferred is None:
        return False
    deferred[wake] = None
    return True


def _flush_deferred() -> None:
    deferred: dict[Callable[[], None], None] | None = getattr(_local, "deferred", None)
    if not deferred:
        return
    _local.deferred, _local.deferred_turns = {}, 0
    for wake in deferred:
        try:
            wake()
        except Exception as exc:  # the worker must live on
            logger.error("a deferred wake-up failed: {}", exc)


@contextlib.contextmanager
def blocking() -> Iterator[None]:
    """Wrap a wait that may be long; a no-op off the pool's workers."""
    pool: ActorPool | None = getattr(_local, "pool", None)
    if pool is None:
        yield
        return
    with pool.blocking():
        yield


def stop_if_idle(ref: pykka.ActorRef[Any]) -> bool:
    """`PooledActor.stop_if_idle` for the actor behind `ref`; False for any other actor."""
    inbox = ref.actor_inbox
    return isinstance(inbox, _Inbox) and inbox.actor.stop_if_idle()


class _PoolFuture(pykka.ThreadingFuture[Any]):
    def get(self, *, timeout: float | None = None) -> Any:
        with blocking():
            return super().get(timeout=timeout)


# the inboxes' locks, shared by stripes: a lock is one more object the collector walks per actor
# (six actors per running job), and an inbox holds its lock for a few list operations only, never
# while taking another's, so two inboxes on one stripe wait for each other at most that long
_INBOX_LOCKS = tuple(threading.Lock() for _ in range(64))
_inbox_ids = itertools.count()


class _Inbox:
    """The actor's queue; putting into an idle, started actor schedules its turn."""

    __slots__ = ("_lock", "_q", "actor", "scheduled", "started")

    def __init__(self, actor: PooledActor) -> None:
        self.actor = actor
        self._q: collections.deque[Envelope[Any]] = collections.deque()
        self._lock = _INBOX_LOCKS[next(_inbox_ids) % len(_INBOX_LOCKS)]
        self.scheduled = False
        self.started = False

    def put(self, envelope: Envelope[Any], /) -> None:
        with self._lock:
            self._q.append(envelope)
            wake = self.started and not self.scheduled
            if wake:
                self.scheduled = True
        if wake:
            self.actor.pool.schedule(self.actor, getattr(envelope.message, "urgent", False))

    def get(self) -> Envelope[Any]:
        with self._lock:
            return self._q.popleft()

    def take(self) -> Envelope[Any] | None:
        with self._lock:
            return self._q.popleft() if self._q else None

    def empty(self) -> bool:
        with self._lock:
            return not self._q

    def start(self) -> None:
        with self._lock:
            self.started = True
            self.scheduled = True
        self.actor.pool.schedule(self.actor)

    def claim(self) -> bool:
        """Take the actor's turn for the caller if it is idle (started, no turn queued or running,
        nothing in its inbox): no worker runs it until `release`. False if it is not idle."""
        with self._lock:
            if not self.started or self.scheduled or self._q:
                return False
            self.scheduled = True
            return True

    def release(self) -> bool:
        """End a turn: True if more messages wait (the actor goes back in the queue)."""
        with self._lock:
            if self._q:
                return True
            self.scheduled = False
            return False


class PooledActor(pykka.Actor):
    """A pykka Actor whose turns run on `pool` (the process-wide one unless set)."""

    pool: ActorPool = POOL
    burst: int = BURST  # messages handled per turn before the actor goes to the back of the queue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._set_up = False
        self._torn_down = False
        # pykka's Actor.__init__, with a urn from a counter instead of uuid4 (a urandom call per
        # actor was 7 % of the start burst at a thousand attempts): unique in the process all the same
        self.actor_urn = _next_urn()
        self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = Flag()  # type: ignore[assignment]  # pykka only sets and reads it
        self._actor_ref = pykka.ActorRef(self)

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> pykka.ActorRef[Any]:
        """pykka's `start` (make, register, start the loop; registered in `live_actors()`, not in
        pykka's registry: see `_LIVE`) without its two debug lines, which
        format the actor's name (`Starting ...`, `Registered ...`) whether or not anything logs at
        debug: six actors per attempt, 10,000 attempts starting at once (bench/RESULTS.md, item 53)."""
        obj = cls(*args, **kwargs)
        ref = obj.actor_ref
        with _LIVE_LOCK:
            _LIVE[ref] = None
        obj._start_actor_loop()
        return ref

    def _stop(self) -> None:
        """pykka's `_stop` (unregister, mark stopped, `on_stop`) without its debug lines (as `start`)."""
        _unregister(self.actor_ref)
        self.actor_stopped.set()
        try:
            self.on_stop()
        except Exception:
            self._handle_failure(*sys.exc_info())

    def stop_if_idle(self) -> bool:
        """Stop this actor on the calling thread, now, if it is idle (its first turn run, none queued
        or running, its inbox empty): its `on_stop` runs here, in the caller's turn, with its turn
        claimed so that no worker runs it meanwhile. What is put meanwhile is answered as after a
        stop. False if it was not idle (nothing done: tell it `_ActorStop`). An end burst stopped
        six actors per attempt, each a tell, a wake-up and a turn of its own (bench/RESULTS.md, item 63)."""
        inbox: _Inbox = self.actor_inbox  # type: ignore[assignment]
        if self.actor_stopped.is_set() or not inbox.claim():
            return False
        try:
            self._stop()
            self._teardown_once()
        finally:
            if inbox.release():  # put while it stopped: answered, as a turn after a stop answers them
                self._actor_loop_teardown()
        return True

    def _create_actor_inbox(self) -> _Inbox:  # type: ignore[override]
        return _Inbox(self)

    @staticmethod
    def _create_future() -> pykka.Future[Any]:
        return _PoolFuture()

    def _start_actor_loop(self) -> None:
        inbox: _Inbox = self.actor_inbox  # type: ignore[assignment]
        inbox.start()

    def _turn(self) -> None:
        """One turn on a pool worker: on_start first, then up to `burst` messages."""
        inbox: _Inbox = self.actor_inbox  # type: ignore[assignment]
        if not self._set_up:
            self._set_up = True
            self._actor_loop_setup()
        handled, burst = 0, self.burst
        while handled < burst and not self.actor_stopped.is_set():
            envelope = inbox.take()
            if envelope is None:
                break
            handled += 1
            self._one(envelope)
        self.pool.messages += handled
        if self.actor_stopped.is_set():
            self._teardown_once()
            inbox.release()
            if not inbox.empty():  # put after the teardown: answer them too
                self._actor_loop_teardown()
            return
        if inbox.release():
            self.pool.schedule(self)

    def _actor_loop_setup(self) -> None:
        """on_start; a raise there is a failure like one in a handler: `on_failure`, then stopped
        (pykka's own loop stops the actor without calling `on_failure`: its parent never heard)."""
        try:
            self.on_start()
        except Exception:
            self._handle_failure(*sys.exc_info())
            try:
                self.on_failure(*sys.exc_info())
            except Exception:
                self._handle_failure(*sys.exc_info())

    def _handle_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """Unregister and stop. Not logged here: `on_failure` logs it where the run's log goes
        (pykka's line goes to the stdlib logger, whose last resort prints a traceback on the terminal)."""
        _unregister(self.actor_ref)
        self.actor_stopped.set()

    def on_failure(self, exception_type: Any, exception_value: Any, traceback: Any) -> None:
        """Actor thread, after a raise in `on_start` or a `tell`ed message: logged with its traceback
        (to the run's log file only: `traceback` is bound, the terminal shows no traceback)."""
        text = "".join(traceback_module.format_exception(exception_type, exception_value, traceback)).rstrip()
        logger.bind(traceback=True).error("{} failed:\n{}", type(self).__name__, text)

    def _teardown_once(self) -> None:
        if not self._torn_down:
            self._torn_down = True
            self._actor_loop_teardown()

    def _one(self, envelope: Envelope[Any]) -> None:
        """pykka's loop body for one envelope (ThreadingActor's semantics)."""
        try:
            response = self._handle_receive(envelope.message)
            if envelope.reply_to is not None:
                envelope.reply_to.set(response)
        except Exception:
            if envelope.reply_to is not None:
                envelope.reply_to.set_exception()
            else:
                self._handle_failure(*sys.exc_info())
                try:
                    self.on_failure(*sys.exc_info())
                except Exception:
                    self._handle_failure(*sys.exc_info())
        except BaseException:  # as pykka's loop does, but stopping our actors only (not the host's)
            self._stop()
            for ref in reversed(live_actors()):
                ref.stop(block=False)


__all__ = ["POOL", "ActorDeadError", "ActorPool", "PooledActor", "blocking", "defer", "live_actors", "stop_if_idle"]
_ = _ActorStop
