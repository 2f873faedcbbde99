"""The suite's own order under xdist (tests/support/schedule.py): every test runs once, each worker's share
starts with its part of the long tests, and the long work is spread evenly."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from support.schedule import LONG_S, groups, order, share_sizes


def test_shares_are_cut_as_worksteal_cuts_them() -> None:
    assert share_sizes(853, 6) == [142, 142, 142, 142, 142, 143]
    assert share_sizes(5, 2) == [2, 3]


@given(st.lists(st.floats(0, 60), min_size=0, max_size=80), st.integers(1, 8))
def test_every_test_runs_once_and_each_share_starts_with_its_long_tests(times: list[float], workers: int) -> None:
    names = [f"t{i}" for i in range(len(times))]
    durations = dict(zip(names, times, strict=True))
    out = order(names, names, durations, workers)
    assert sorted(out) == sorted(names)
    if workers < 2 or len(names) < workers:
        assert out == names
        return
    start = 0
    for size in share_sizes(len(names), workers):
        share = out[start:start + size]
        start += size
        long = [n for n in share if durations[n] >= LONG_S]
        assert share[:len(long)] == long  # the long ones first
        assert [durations[n] for n in long] == sorted((durations[n] for n in long), reverse=True)
    short = [n for n in out if durations[n] < LONG_S]
    assert short == [n for n in names if durations[n] < LONG_S]  # the rest keep their order


def test_the_long_work_is_spread_evenly() -> None:
    names = [f"t{i}" for i in range(60)]
    durations = {n: 0.1 for n in names} | {"t3": 40.0, "t4": 30.0, "t50": 25.0, "t51": 24.0, "t59": 10.0}
    out = order(names, names, durations, 3)
    heads = [out[0:20], out[20:40], out[40:60]]
    loads = sorted(sum(durations[n] for n in h if durations[n] >= LONG_S) for h in heads)
    # longest first, each to the least loaded share: 40 | 30 | 25, then 24 joins 25 and 10 joins 30
    assert loads == [40.0, 40.0, 49.0]


@given(st.lists(st.floats(0, 60), min_size=0, max_size=80), st.integers(2, 8), st.data())
def test_the_tests_of_a_group_run_in_one_share_and_every_test_once(
        times: list[float], workers: int, data: st.DataObject) -> None:
    names = [f"t{i}" for i in range(len(times))]
    durations = dict(zip(names, times, strict=True))
    grouped = data.draw(st.sets(st.integers(0, max(0, len(names) - 1)), max_size=6)) if names else set()
    out = order(names, names, durations, workers, {i: "own" for i in grouped})
    assert sorted(out) == sorted(names)
    if len(names) < workers:
        return
    members = {names[i] for i in grouped}
    start, holding = 0, []
    for size in share_sizes(len(names), workers):
        share = out[start:start + size]
        start += size
        if members & set(share):
            holding.append(share)
    if len(members) <= min(share_sizes(len(names), workers)):  # (a larger group goes as single tests)
        assert len(holding) <= 1
        assert members <= set(holding[0] if holding else [])


def test_a_group_larger_than_a_share_is_dealt_as_single_tests() -> None:
    names = [f"t{i}" for i in range(12)]
    durations = {n: 5.0 for n in names}
    out = order(names, names, durations, 3, {i: "own" for i in range(6)})  # shares of 4
    assert sorted(out) == sorted(names)


def test_moto_tests_go_to_two_parts_of_even_length_and_skypilots_own_into_one() -> None:
    names = [f"t{i}" for i in range(10)]
    durations = {"t0": 20.0, "t1": 18.0, "t2": 10.0, "t3": 9.0, "t4": 1.0, "t5": 30.0}
    fixtures = [{"moto", "sky_own"}, {"moto"}, {"moto"}, {"moto", "sky_own"}, {"moto"}, set(), {"sshd"},
                {"moto"}, set(), set()]
    got = groups(fixtures, names, durations)
    assert set(got) == {0, 1, 2, 3, 4, 7}  # the moto tests, and only they
    assert got[0] == got[3]  # SkyPilot's own tests together
    parts = {p: sum(durations.get(names[i], 0.0) for i in got if got[i] == p) for p in set(got.values())}
    assert len(parts) == 2
    assert sorted(parts.values()) == [29.0, 29.0]  # 20 + 9 (+ t7: no time known) | 18 + 10 + 1


def test_the_zygotes_and_skypilots_own_tests_join_moto_s_first_part_without_asking_for_moto() -> None:
    names = [f"t{i}" for i in range(8)]
    durations = {"t0": 20.0, "t1": 18.0, "t2": 10.0}
    fixtures = [{"moto"}, {"moto"}, {"sky_own"}, {"runpod_zygote"}, {"runpod_zygote", "moto"}, set(), {"sshd"},
                {"runpod_zygote", "tmp_path"}]
    got = groups(fixtures, names, durations)
    assert set(got) == {0, 1, 2, 3, 4, 7}  # the plain and the sshd tests stay out
    assert got[2] == got[3] == got[4] == got[7]  # every process that starts a zygote or SkyPilot's: one
    assert got[0] != got[1]  # moto's own two still split (t0 to the part without the 10 s of SkyPilot's)
    assert got[1] == got[2]


def test_every_timed_test_names_a_file_of_the_suite() -> None:
    """tests/durations.json follows the tests when they move: each key's file exists."""
    from support.schedule import load

    root = Path(__file__).resolve().parents[2]
    missing = sorted({k.split("::")[0] for k in load() if not (root / k.split("::")[0]).is_file()})
    assert missing == []
