"""The capacity walk: down the candidate list, place by place, until one has stock.

Each candidate's offers are asked for when the walk reaches it (from the candidate's current
account: a refusal that says an account is out of quota or balance moves the walk to the same
place on the candidate's next account, `switch_account`). A place that refused (no
capacity, a launch that failed) is passed over; when every candidate is exhausted the walk asks
every cloud again, once (stock comes back), before it gives up. `fits` (after an out-of-memory
end: only offers with more GPU memory) passes over every offer it refuses. Pure state, no I/O: the
job supervisor fetches offers when `next()` says `NeedOffers`.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from actor_run.protocols.messages import Offer


class NeedOffers(msgspec.Struct, frozen=True):
    candidate: int


class Exhausted(msgspec.Struct, frozen=True):
    pass


Place = tuple[int, str, str, str, str, str]


def place(offer: Offer) -> Place:
    return (offer.candidate, offer.cloud, offer.region, offer.gpu, offer.host, offer.account)


class Walk:
    def __init__(self, n_candidates: int, fits: Callable[[Offer], bool] | None = None) -> None:
        self.n = n_candidates
        self.fits = fits
        self.index = 0
        self.offers: dict[int, list[Offer]] = {}
        self.passed: set[Place] = set()
        self.refreshed = False

    def next(self) -> Offer | NeedOffers | Exhausted:
        while self.index < self.n:
            if self.index not in self.offers:
                return NeedOffers(self.index)
            for offer in self.offers[self.index]:
                if place(offer) not in self.passed and (self.fits is None or self.fits(offer)):
                    return offer
            self.index += 1
        if not self.refreshed:
            self.refreshed = True
            self.index = 0
            self.offers.clear()
            self.passed.clear()
            return self.next()
        return Exhausted()

    def set_offers(self, candidate: int, offers: list[Offer]) -> None:
        self.offers[candidate] = offers

    def pass_over(self, offer: Offer) -> None:
        self.passed.add(place(offer))

    def switch_account(self, offer: Offer, account: str) -> None:
        """`offer`'s account is out of quota or balance: its candidate's places from `offer` on are
        tried next on `account`, beginning with the same place."""
        offers = self.offers.get(offer.candidate, [])
        at = next((k for k, o in enumerate(offers) if place(o) == place(offer)), 0)
        rest = [offer, *[o for o in offers[at:] if place(o) != place(offer)]]
        self.offers[offer.candidate] = [msgspec.structs.replace(o, account=account) for o in rest]
        self.index = offer.candidate

    def skip_candidate(self, candidate: int) -> None:
        """Pass over every place of `candidate` (its last account is out of quota)."""
        for o in self.offers.get(candidate, []):
            self.pass_over(o)

    def is_last(self, offer: Offer) -> bool:
        return offer.candidate == self.n - 1


class Accounts:
    """Which of its accounts each candidate is walked on now (its `accounts`, in order; none: ""),
    kept across the job's walks: an account found out of quota stays behind."""

    def __init__(self, accounts: list[list[str]]) -> None:
        self._accounts = accounts  # each candidate's
        self._at: dict[int, int] = {}

    def of(self, candidate: int) -> str:
        accounts = self._accounts[candidate]
        return accounts[self._at.get(candidate, 0)] if accounts else ""

    def next(self, walk: Walk, offer: Offer) -> bool:
        """`offer`'s account is out of quota or balance: `walk` goes to the same place on the
        candidate's next account (True), or, after its last, past the candidate (False)."""
        i = offer.candidate
        accounts, at = self._accounts[i], self._at.get(i, 0)
        if at + 1 < len(accounts):
            self._at[i] = at + 1
            walk.switch_account(offer, accounts[at + 1])
            return True
        walk.skip_candidate(i)
        return False
