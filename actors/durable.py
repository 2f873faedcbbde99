"""Waiting on the reactor until the ledger has a row the next step needs (a lease's intent before its
create call, a queue job's handle, a job's claim): `wait_durable`, and `IntentNotRecorded` when the
ledger could not write it in time."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import trio

from actor_run.actors.base import Pending
from actor_run.protocols.failures import ActorRunError, CallCancelled

INTENT_WAIT_S = 60.0  # the bound Waiter.wait puts on any waited ledger write


class IntentNotRecorded(ActorRunError):
    """The ledger could not record a row the next step waits for (a lease's intent: no create call
    went out; a queue job's handle: the attempt ends, and deleting its endpoint ends the job)."""


async def wait_durable(pending: Pending, soon: Callable[[Callable[[], Any]], None], what: str = "the intent") -> None:
    """Wait (on the reactor) until the ledger has `pending`; raise IntentNotRecorded if it failed.
    Under load the commit is often in before the launch task runs: then nothing is waited for.
    `what` names the row in the error (a lease's intent, a queue job's handle)."""
    committed = trio.Event()
    answers: list[BaseException | None] = []
    inline = True  # when_done is calling back at once, on this thread

    def done(error: BaseException | None) -> None:  # on the ledger's thread, or at once on this one
        answers.append(error)
        if not inline:
            with contextlib.suppress(CallCancelled):  # the reactor stopped: nobody waits any more
                soon(committed.set)

    pending.when_done(done)
    inline = False
    if not answers:  # a callback from the ledger's thread after this check also sets `committed`
        with trio.move_on_after(INTENT_WAIT_S) as waited:
            await committed.wait()
        if waited.cancelled_caught:
            raise IntentNotRecorded(f"the ledger did not commit {what} within {INTENT_WAIT_S:.0f} s")
    if answers[0] is not None:
        raise IntentNotRecorded(f"the ledger could not record {what}: {answers[0]}")


__all__ = ["INTENT_WAIT_S", "IntentNotRecorded", "wait_durable"]
