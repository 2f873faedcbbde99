"""The offer book (supervisors/tree/offers.py): asks for one candidate while a call is out share it."""

from __future__ import annotations

import queue
from typing import Any

import outcome
import pytest
import trio

from actor_run.actors import Reactor
from actor_run.protocols.messages import Offer
from actor_run.protocols.specs import CandidateSpec
from actor_run.supervisors.tree.offers import OfferBook


class HeldCloud:
    """A provider whose offers calls answer only when the test opens the gate; it counts them."""

    name = "held"

    def __init__(self) -> None:
        self.calls = 0
        self.error: BaseException | None = None
        self.gate: trio.Event | None = None
        self.reached: tuple[int, trio.Event] | None = None  # (calls, set once that many came)

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        self.calls += 1
        if self.reached is not None and self.calls >= self.reached[0]:
            self.reached[1].set()
        if self.gate is None:
            self.gate = trio.Event()
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return [Offer(cloud="held", region=f"r{self.calls}", gpu=candidate.gpu, hourly_usd=1.0, candidate=index)]


def open_gate(reactor: Reactor, cloud: HeldCloud, calls: int) -> None:
    """Once `calls` calls in all have reached the provider, let the waiting ones answer."""

    async def release() -> None:
        if cloud.calls < calls:
            reached = trio.Event()
            cloud.reached = (calls, reached)
            await reached.wait()  # bounded by the call's timeout
        gate, cloud.gate = cloud.gate, None
        if gate is not None:
            gate.set()

    reactor.call(release, timeout=10)


def answers(box: queue.Queue[Any], n: int) -> list[Any]:
    return [box.get(timeout=10) for _ in range(n)]


def test_asks_while_a_call_is_out_share_its_answer(reactor: Reactor) -> None:
    cloud = HeldCloud()
    book = OfferBook(reactor, {"held": cloud})  # type: ignore[dict-item]  # only offers is asked
    a100, h100 = CandidateSpec(cloud="held", gpu="A100"), CandidateSpec(cloud="held", gpu="H100")
    box: queue.Queue[Any] = queue.Queue()
    for _ in range(50):
        book.ask(a100, 0, box.put)
    book.ask(a100, 1, box.put)  # another index: the job's second candidate, its own call
    book.ask(h100, 0, box.put)  # another spec
    assert book.calls == 3
    open_gate(reactor, cloud, 3)
    got = answers(box, 52)
    assert cloud.calls == 3
    values = [r.unwrap() for r in got]
    a100_first = [v for v in values if v[0].gpu == "A100" and v[0].candidate == 0]
    assert len(a100_first) == 50
    assert all(v == a100_first[0] for v in a100_first)  # one call's answer, the same for each
    assert box.empty()

    book.ask(a100, 0, box.put)  # asked after that answer came: a call of its own
    assert book.calls == 4
    open_gate(reactor, cloud, 4)
    assert answers(box, 1)[0].unwrap()[0].region == "r4"


def test_a_failed_call_reaches_every_asker_and_the_next_ask_calls_again(reactor: Reactor) -> None:
    cloud = HeldCloud()
    cloud.error = OSError("provider down")
    book = OfferBook(reactor, {"held": cloud})  # type: ignore[dict-item]
    cand = CandidateSpec(cloud="held", gpu="A100")
    box: queue.Queue[Any] = queue.Queue()
    for _ in range(5):
        book.ask(cand, 0, box.put)
    open_gate(reactor, cloud, 1)
    got = answers(box, 5)
    assert all(isinstance(r, outcome.Error) and str(r.error) == "provider down" for r in got)
    cloud.error = None
    book.ask(cand, 0, box.put)
    open_gate(reactor, cloud, 2)
    assert answers(box, 1)[0].unwrap()[0].gpu == "A100"
    assert (book.calls, cloud.calls) == (2, 2)


def test_an_unknown_cloud_raises_at_the_ask_and_leaves_nothing_out(reactor: Reactor) -> None:
    book = OfferBook(reactor, {})
    with pytest.raises(KeyError):
        book.ask(CandidateSpec(cloud="nowhere"), 0, lambda r: None)
    assert book.calls == 0


def test_jobs_waiting_for_capacity_are_woken_once_when_a_machine_is_let_go(reactor: Reactor) -> None:
    book = OfferBook(reactor, {})
    woken: list[str] = []
    book.when_freed("job-a", lambda: woken.append("a-old"))
    book.when_freed("job-a", lambda: woken.append("a"))  # its newer wait replaces the older
    book.when_freed("job-b", lambda: woken.append("b"))
    assert woken == []  # nothing freed yet
    book.freed()
    assert woken == ["a", "b"]
    book.freed()  # each wake-up is for one wait: a job waiting again registers again
    assert woken == ["a", "b"]


def test_a_job_that_ended_while_waiting_is_forgotten_not_woken(reactor: Reactor) -> None:
    """A waiting job that ended (canceled, its wait ran out) is dropped at once (job.py's end), not
    kept, with its actor, until a machine is next let go."""
    book = OfferBook(reactor, {})
    woken: list[str] = []
    book.when_freed("job-a", lambda: woken.append("a"))
    book.when_freed("job-b", lambda: woken.append("b"))
    book.forget("job-a")
    book.forget("job-c")  # one that waits for nothing: nothing happens
    book.freed()
    assert woken == ["b"]

