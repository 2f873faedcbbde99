"""supervisors/tree/budget.py: reservations before leases, charges within them, releases that replace
them by what was spent; the rule spent + reserved <= limit under any interleaving."""

from __future__ import annotations

import threading

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from actor_run.supervisors.tree.budget import MICRO, Budget, BudgetChange, reservation_usd, to_micro

# one step: (kind, holder index, amount in cents, fraction of the reservation actually spent)
steps = st.lists(st.tuples(st.sampled_from(["reserve", "charge", "release"]), st.integers(0, 7),
                           st.integers(0, 900), st.floats(0.0, 1.0)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(limit_cents=st.integers(1, 3000), ops=steps)
def test_reserved_plus_spent_never_passes_the_limit(limit_cents: int, ops: list[tuple[str, int, int, float]]) -> None:
    changes: list[BudgetChange] = []
    limit = limit_cents / 100
    b = Budget(limit, record=changes.append)
    held: dict[tuple[str, int], float] = {}  # the model: what each live holder reserved
    spent = 0.0
    for kind, i, cents, part in ops:
        holder = (f"j/seed-{i}", 0)
        if kind == "reserve":
            before = b.statistics()
            r = b.reserve(holder, cents / 100)
            if holder in held:
                assert r is not None
                assert r.usd == held[holder]  # the same reservation, not a second one
            elif r is None:  # refused only when it would not fit
                assert to_micro(before.spent_usd + before.reserved_usd + cents / 100) > round(limit * MICRO)
                assert b.statistics() == msgspec.structs.replace(before, refused=before.refused + 1)
            else:
                held[holder] = r.usd
                assert r.usd >= cents / 100
        elif kind == "charge":
            cap = held.get(holder)
            usd = (cap or 0.0) * (part * 1.5)  # sometimes past the reservation: the guard's case
            ok = b.charge(holder, usd)
            assert ok == (cap is None or to_micro(usd) <= to_micro(cap))
        else:
            cap = held.pop(holder, None)
            actual = (cap or 0.0) * part  # the guard kept it within the reservation
            assert b.release(holder, actual).replaced_usd == (cap or 0.0)
            spent += to_micro(actual) / MICRO
        s = b.statistics()
        assert round((s.spent_usd + s.reserved_usd) * MICRO) <= round(limit * MICRO)
        assert abs(s.reserved_usd - sum(held.values())) < 1e-9
        assert abs(s.spent_usd - spent) < 1e-6
        assert s.live_usd <= s.reserved_usd + 1e-9
        assert s.overrun_usd == 0
    # the recorded changes alone replay to the same totals, in seq order
    assert [c.seq for c in changes] == list(range(1, len(changes) + 1))
    for c in changes:
        assert round((c.spent_usd + c.reserved_usd) * MICRO) <= round(limit * MICRO)


@settings(max_examples=30, deadline=None)
@given(amounts=st.lists(st.integers(1, 500), min_size=1, max_size=40), limit_cents=st.integers(100, 2000))
def test_threads_racing_for_the_last_dollars_never_overrun(amounts: list[int], limit_cents: int) -> None:
    b = Budget(limit_cents / 100)
    start = threading.Barrier(4)

    def worker(k: int) -> None:
        start.wait()
        for n, cents in enumerate(amounts):
            holder = (f"w{k}", n)
            if b.reserve(holder, cents / 100) is not None:
                s = b.statistics()
                assert s.spent_usd + s.reserved_usd <= limit_cents / 100 + 1e-9
                b.release(holder, cents / 200)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    s = b.statistics()
    assert s.reserved_usd == 0
    assert s.spent_usd <= limit_cents / 100 + 1e-9


def test_an_unconfirmed_deletion_overruns_and_then_nothing_more_is_reserved() -> None:
    b = Budget(1.0)
    assert b.reserve(("a/seed-0", 0), 0.6) is not None
    b.release(("a/seed-0", 0), 1.4)  # billed to the deadline: more than was reserved
    s = b.statistics()
    assert s.overrun_usd == 0.4
    assert b.reserve(("a/seed-1", 0), 0.01) is None


def test_adopted_reservations_count_without_a_record() -> None:
    changes: list[BudgetChange] = []
    b = Budget(1.0, spent_usd=0.25, record=changes.append)
    b.adopt(("a/seed-0", 2), 0.5)
    assert b.reserve(("a/seed-1", 0), 0.3) is None  # 0.25 + 0.5 + 0.3 > 1
    assert b.reserve(("a/seed-1", 0), 0.25) is not None
    assert [c.kind for c in changes] == ["reserve"]


def test_a_reservation_is_the_price_over_the_hold() -> None:
    assert reservation_usd(3.6, 4200) == 4.2
