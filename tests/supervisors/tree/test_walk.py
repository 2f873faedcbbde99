"""supervisors/tree/walk.py: the capacity walk, as pure state."""

from __future__ import annotations

from actor_run.protocols.messages import Offer
from actor_run.supervisors.tree.walk import Exhausted, NeedOffers, Walk


def offer(candidate: int, region: str, gpu: str = "A100", usd: float = 1.0) -> Offer:
    return Offer(cloud="sim", region=region, gpu=gpu, hourly_usd=usd, candidate=candidate)


def test_walk_asks_for_each_candidates_offers_in_order_and_takes_the_first() -> None:
    w = Walk(3)
    assert w.next() == NeedOffers(0)
    a, b = offer(0, "us-east"), offer(0, "eu-west")
    w.set_offers(0, [a, b])
    assert w.next() == a
    assert w.next() == a  # a retry that did not pass the place over stays there


def test_passing_over_moves_to_the_next_offer_then_the_next_candidate() -> None:
    w = Walk(2)
    w.next()
    a, b = offer(0, "us-east"), offer(0, "eu-west")
    w.set_offers(0, [a, b])
    w.pass_over(w.next())  # type: ignore[arg-type]
    assert w.next() == b
    w.pass_over(b)
    assert w.next() == NeedOffers(1)
    c = offer(1, "ap-south")
    w.set_offers(1, [c])
    assert w.next() == c


def test_a_candidate_without_offers_is_skipped() -> None:
    w = Walk(3)
    assert w.next() == NeedOffers(0)
    w.set_offers(0, [])
    assert w.next() == NeedOffers(1)
    w.set_offers(1, [])
    assert w.next() == NeedOffers(2)
    c = offer(2, "r")
    w.set_offers(2, [c])
    assert w.next() == c


def test_one_refresh_after_exhaustion_then_exhausted() -> None:
    w = Walk(2)
    a, b = offer(0, "r0"), offer(1, "r1")
    w.next()
    w.set_offers(0, [a])
    w.pass_over(w.next())  # type: ignore[arg-type]
    assert w.next() == NeedOffers(1)
    w.set_offers(1, [b])
    w.pass_over(w.next())  # type: ignore[arg-type]
    # every place passed over: the walk asks every cloud again, from the first candidate
    assert w.next() == NeedOffers(0)
    w.set_offers(0, [a])
    assert w.next() == a  # stock came back: the places passed over before are tried again
    w.pass_over(a)
    assert w.next() == NeedOffers(1)
    w.set_offers(1, [b])
    w.pass_over(b)
    assert w.next() == Exhausted()  # only one refresh
    assert w.next() == Exhausted()


def test_exhausted_with_no_stock_anywhere_after_asking_twice() -> None:
    w = Walk(2)
    asked = []
    while not isinstance(step := w.next(), Exhausted):
        assert isinstance(step, NeedOffers)
        asked.append(step.candidate)
        w.set_offers(step.candidate, [])
    assert asked == [0, 1, 0, 1]


def test_places_are_told_apart_by_cloud_region_gpu_and_host() -> None:
    w = Walk(1)
    w.next()
    a = offer(0, "r", "A100")
    h = offer(0, "r", "H100")
    w.set_offers(0, [a, h])
    w.pass_over(offer(0, "r", "A100", usd=9.0))  # the price is not part of the place
    assert w.next() == h


def test_is_last() -> None:
    w = Walk(3)
    assert not w.is_last(offer(0, "r"))
    assert not w.is_last(offer(1, "r"))
    assert w.is_last(offer(2, "r"))
    assert Walk(1).is_last(offer(0, "r"))
