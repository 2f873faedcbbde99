"""EventBus: where every event an attempt emits goes, in order: the ledger (progress only at a
checkpoint or a new stage), the budget's live cost, then each subscriber, on the emitting thread;
and a job's end, which resolves its handle once the ledger has it. An object the Runner holds: it
holds the ledger, the board of handles and nothing of the Runner."""

from __future__ import annotations

import threading
from collections.abc import Callable

from actor_run.protocols.messages import AttemptEnded, Event, JobEnded, Metered, Progress
from actor_run.protocols.specs import job_key
from actor_run.supervisors.api.handle import Board
from actor_run.supervisors.ledger import Ledger
from actor_run.supervisors.tree.batch import Spent


class EventBus:
    """`subscribe(fn)`, `emit(event)` (the Context's emit: any actor thread) and `job_ended(e)`
    (the batch supervisor's on_end: its thread)."""

    def __init__(self, ledger: Ledger, board: Board, budget_usd: float | None) -> None:
        self.ledger = ledger
        self.board = board
        self.budget_usd = budget_usd
        self._subscribers: list[Callable[[Event], None]] = []
        self._reported: dict[str, dict[int, float]] = {}  # a running job's live cost per attempt
        self._stages: dict[tuple[str, int, int], str] = {}  # the stage last recorded of each attempt
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[Event], None]) -> None:
        """`fn(event)` for every event from now on, on the emitting (actor) thread: keep it quick."""
        self._subscribers.append(fn)

    def held(self) -> int:
        """How many attempts and jobs the bus keeps something of (0 once every job ended)."""
        with self._lock:
            return len(self._stages) + len(self._reported)

    def emit(self, event: Event) -> None:
        """The ledger, the budget guard, then every subscriber (on the emitting thread)."""
        # every progress line is in the seed's progress.jsonl; the ledger keeps those that matter
        # for a resume (a checkpoint) and spares a write per poll per job. Metered is a running
        # figure for the view and the budget: what an attempt cost is in its attempts row
        if isinstance(event, Progress):
            # and each new stage, so `actor-run status` from another process says where a job is
            stage_key = (event.job, event.seed, event.attempt)  # a tuple: no string formatted per progress line
            if "checkpoint" in event.line or self._stages.get(stage_key) != event.stage:
                self._stages[stage_key] = event.stage
                self.ledger.record_event(event)
        elif not isinstance(event, Metered):
            if isinstance(event, AttemptEnded):  # an open Runner keeps nothing per attempt that ended
                self._stages.pop((event.job, event.seed, event.attempt), None)
            self.ledger.record_event(event)
        if isinstance(event, Metered) and self.budget_usd is not None:
            self._meter(event)
        for fn in self._subscribers:
            fn(event)

    def _meter(self, m: Metered) -> None:
        """Tell the batch a job's live cost only when it moved by a step that matters (1 % of the budget)."""
        assert self.budget_usd is not None
        key = job_key(m.job, m.seed)
        with self._lock:
            attempts = self._reported.setdefault(key, {})
            if m.usd - attempts.get(m.attempt, 0.0) < self.budget_usd / 100:
                return
            attempts[m.attempt] = m.usd
            total = sum(attempts.values())
        self.board.tell(Spent(key=key, usd=total))

    def job_ended(self, e: JobEnded) -> None:
        """A job ended (on the batch supervisor's thread): record it, then resolve its handle once
        the ledger has the end."""
        key = job_key(e.job, e.seed)
        with self._lock:
            self._reported.pop(key, None)  # the job's live cost: its attempts' rows have what they cost
        durable = self.ledger.record_job_end(key=key, state=e.outcome if e.outcome == "succeeded" else "failed",
                                             failure=e.failure, detail=e.detail, attempts=e.attempts, usd=e.usd)
        h = self.board.running(key)
        if h is None:
            return
        if not self.ledger.may_write(key):
            h._resolve(e)  # handed back or taken over: the ledger refuses this end, nothing to wait for
        else:
            # the handle resolves once the ledger has the end (on the ledger's thread: a future with no
            # done-callbacks, so nothing runs there but the wake-up of whoever waits on it); the batch
            # does not wait for the commit meanwhile
            durable.when_done(lambda _error: h._resolve(e))
