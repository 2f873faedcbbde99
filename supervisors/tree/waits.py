"""A job's waits for a machine it may rent (job.py): for stock when no candidate place has any, and
for room in a team budget too full for its reservation (`on_budget_full = "wait"`).

Both waits share one clock (`JobWait.since`): a job sits without a machine at most its
`capacity_wait_s` (default by cloud: `capacity_wait`), asking again with backoff (0.5 s doubling up
to `CAPACITY_ASK_MAX_S`, so never a busy loop) and at once when something of its batch may have
made room: a machine let go (offers.py `OfferBook.freed`) for stock, a released reservation of the
batch committed to the ledger (`Wakeups`, below) for a team budget. Other runs and workers free
money too: the backoff's asks find that.

`Shortfalls` keeps why a walk found no place it could take, for the end's detail.

Pure bookkeeping: no actors, no I/O. `Wakeups` is safe from any thread; `JobWait` and `Shortfalls`
belong to their job's actor thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from actor_run.protocols.specs import Job

# How long a job waits for capacity when its policy says nobody (`capacity_wait_s` unset), by the
# clouds it may use (the longest of its candidates'). Rented clouds: GPU stock comes and goes by
# the minute. The sim stands in for them, shorter. Your own machines (ssh, local): the job's
# `timeout_s`. A serverless endpoint queues jobs itself: none.
CAPACITY_WAIT_S: dict[str, float] = {"sim": 300.0, "runpod-serverless": 0.0}
RENTED_CAPACITY_WAIT_S = 1800.0
OWN_MACHINES = ("ssh", "local")
CAPACITY_ASK_MAX_S = 30.0  # the longest pause between two asks while waiting
FIRST_PAUSE_S = 0.5


def capacity_wait(job: Job) -> float:
    """How long `job` may wait for a machine: its `capacity_wait_s`, else by its clouds (above)."""
    p = job.policy
    if p.capacity_wait_s is not None:
        return p.capacity_wait_s
    own = job.timeout_s
    return max((own if c.cloud in OWN_MACHINES else CAPACITY_WAIT_S.get(c.cloud, RENTED_CAPACITY_WAIT_S)
                for c in job.candidates), default=0.0)


def wanted(job: Job) -> str:
    """What a waiting job waits for, in a line: each candidate's cloud, GPU and regions."""
    return "; ".join(f"{c.cloud} {c.gpu or 'any GPU'}" + (f" in {', '.join(c.regions)}" if c.regions else "")
                     for c in job.candidates)


class JobWait:
    """One job's wait: since when (monotonic), for what (`""`: stock; else a team budget's name),
    the next pause, and the generation its wake-ups carry (only the first wake-up of a round counts)."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.what: str | None = None
        self.pause = FIRST_PAUSE_S
        self.gen = 0

    def step(self, what: str, limit_s: float, now: float | None = None) -> tuple[bool, float]:
        """A round of the wait for `what` (bounded by `limit_s` from its start): whether it is new (or
        waits for something else than the last round: say so), and the seconds left (<= 0: over)."""
        now = time.monotonic() if now is None else now
        fresh = self.since is None or self.what != what
        if self.since is None:
            self.since, self.pause = now, FIRST_PAUSE_S
        self.what = what
        return fresh, self.since + limit_s - now

    def next_pause(self, left_s: float) -> float:
        """The pause before the next ask (at most `left_s`); the one after it is twice as long."""
        pause = min(self.pause, left_s)
        self.pause = min(self.pause * 2, CAPACITY_ASK_MAX_S)
        return pause

    def found(self) -> None:
        """It found a place: a wait after this is a new one."""
        self.since, self.what = None, None


class Wakeups:
    """Jobs to wake once when something of their batch frees: `when(key, fn)` (a job's newer `fn`
    replaces its older one), `wake()` calls each once, on the thread that calls it. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, Callable[[], None]] = {}

    def when(self, key: str, fn: Callable[[], None]) -> None:
        with self._lock:
            self._waiting[key] = fn

    def forget(self, key: str) -> None:
        with self._lock:
            self._waiting.pop(key, None)

    def wake(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for fn in waiting.values():
            fn()


__all__ = ["CAPACITY_ASK_MAX_S", "CAPACITY_WAIT_S", "OWN_MACHINES", "RENTED_CAPACITY_WAIT_S", "JobWait", "Wakeups",
           "capacity_wait", "wanted"]


class Shortfalls:
    """Why a job's walk found no place it could take, for the detail of its end: the offers it passed
    over for want of money (`money`, this walk's; `team`: a team budget short of room it may get
    back) and the candidates whose offers could not be read at their last ask (`unread`: why)."""

    def __init__(self) -> None:
        self.money: list[str] = []
        self.team: str | None = None
        self.unread: dict[int, str] = {}

    def new_walk(self) -> None:
        self.money, self.team = [], None

    def money_text(self) -> str:
        """The newest three distinct reasons (two offers of one place, on demand and interruptible,
        read the same)."""
        return "; ".join(list(dict.fromkeys(self.money))[-3:])

    def unread_text(self) -> str:
        """`; candidate N's offers could not be read: why` for each (at most three), or nothing."""
        return "".join(f"; candidate {i}'s offers could not be read: {why}"
                       for i, why in sorted(self.unread.items())[:3])
