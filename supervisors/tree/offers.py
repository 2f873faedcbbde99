"""OfferBook: asks clouds for offers on behalf of many jobs, one call per candidate at a time.

A batch of a thousand seeds starts its jobs together, and each job's walk begins by asking its
first candidate's cloud what has stock: a thousand identical calls to a provider's API (which
rate-limits them) and a reactor task each. The book sends one: an ask for a candidate while a call
for the same candidate (same index, same spec) is out waits for that call's answer instead of
making another. An ask after the answer came makes a new call, so no job gets an answer older than
its own ask: it is what the job would have heard had it asked itself a moment earlier.

`ask` is safe from any thread; `reply(outcome)` runs on the reactor thread (it must only hand the
answer on, e.g. `ActorRef.tell`).

Jobs waiting for capacity share the book too: `when_freed(key, fn)` calls `fn` once, the next time
a job of the batch says (`freed()`) that one of its machines was let go, so every waiting job asks
again at that moment (and their asks go out as one call per candidate, above). A waiter's newer
`fn` replaces its older one (`key`: the job), so a long wait holds one entry, not one per round.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import msgspec
import outcome

from actor_run.actors import Reactor, Result
from actor_run.protocols.clouds import Cloud, cloud_key
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import CandidateSpec

Reply = Callable[[Result[list[Offer]]], None]
_encode = msgspec.json.Encoder().encode
# (candidate index, the candidate's JSON @ account): one call out per key


def _copy(result: Result[list[Offer]]) -> Result[list[Offer]]:
    if isinstance(result, outcome.Value):
        return outcome.Value(list(result.value))
    return outcome.Error(result.error)


class OfferBook:
    def __init__(self, reactor: Reactor, clouds: Mapping[str, Cloud]) -> None:
        self._reactor = reactor
        self._clouds = clouds
        self._lock = threading.Lock()
        self._out: dict[tuple[int, bytes], list[Reply]] = {}  # calls out: who waits for each
        self._freed: dict[str, Callable[[], None]] = {}  # jobs waiting for capacity, to wake once
        self.calls = 0  # calls made (for tests and benches)

    def when_freed(self, key: str, fn: Callable[[], None]) -> None:
        """Call `fn` (once, on the thread that calls `freed`) when a machine is next let go; it
        replaces what `key` asked for before."""
        with self._lock:
            self._freed[key] = fn

    def forget(self, key: str) -> None:
        """`key` ended: it waits for nothing any more (what it asked for would be kept, and its actor
        with it, until a machine is next let go: never, where none is)."""
        with self._lock:
            self._freed.pop(key, None)

    def freed(self) -> None:
        """A machine of the batch was let go: wake every job waiting for capacity."""
        with self._lock:
            waiting, self._freed = self._freed, {}
        for fn in waiting.values():
            fn()

    def ask(self, candidate: CandidateSpec, index: int, reply: Reply, account: str = "") -> None:
        """Offers for `candidate` (the job's `index`-th) on one of its cloud's accounts: `reply` hears
        the answer of a call made now, or of the one for the same candidate already out. Each
        offer names the account (whichever cloud module answered it)."""
        cloud = self._clouds[cloud_key(candidate.cloud, account)]  # an unknown one raises here, before anything is out
        key = (index, _encode(candidate) + b"@" + account.encode())
        with self._lock:
            waiting = self._out.get(key)
            if waiting is not None:
                waiting.append(reply)
                return
            self._out[key] = [reply]
            self.calls += 1

        def answered(result: Result[list[Offer]]) -> None:  # on the reactor thread
            if account and isinstance(result, outcome.Value):
                result = outcome.Value([o if o.account == account else msgspec.structs.replace(o, account=account)
                                        for o in result.value])
            with self._lock:
                waiters = self._out.pop(key)
            for fn in waiters:  # an Outcome unwraps once, and a list is mutable: each asker its own
                fn(_copy(result))

        try:
            self._reactor.spawn(cloud.offers, candidate, index, on_done=answered, name=f"offers:{candidate.cloud}")
        except BaseException:  # the reactor has stopped: nothing is out, and the asker hears the raise
            with self._lock:
                self._out.pop(key, None)
            raise
