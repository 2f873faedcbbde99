"""protocols/names.py: machine names carry job, seed, attempt, owner and deadline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actor_run.protocols.names import PREFIX, MachineName, encode_name, parse_name

jobs = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40)
owners = st.text(alphabet="0123456789abcdef", min_size=8, max_size=32)


@given(
    job=jobs,
    seed=st.integers(min_value=-(10**9), max_value=10**9),
    attempt=st.integers(min_value=0, max_value=10**6),
    owner=owners,
    deadline=st.floats(min_value=0, max_value=4e9, allow_nan=False),
)
def test_encode_parse_round_trip(job: str, seed: int, attempt: int, owner: str, deadline: float) -> None:
    name = encode_name(job, seed, attempt, owner, deadline)
    assert name.startswith(PREFIX)
    assert parse_name(name) == MachineName(job=job, seed=seed, attempt=attempt, owner=owner[:8], deadline=int(deadline))
    assert str(parse_name(name)) == name


def test_an_example() -> None:
    name = encode_name("seeds", -3, 2, "0123abcd" + "f" * 24, 1_700_000_000.9)
    assert name == "ar-seeds-n3-a2-0123abcd-d1700000000"
    assert parse_name(name) == MachineName(job="seeds", seed=-3, attempt=2, owner="0123abcd", deadline=1_700_000_000)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "ar-",
        "gpu-worker-1",
        "ar-seeds-1-a0-0123abcd",
        "ar-seeds-1-a0-0123abcd-d",
        "ar-seeds-1-0-0123abcd-d5",
        "ar-Seeds-1-a0-0123abcd-d5",
        "ar-seeds-1-a0-0123ABCD-d5",
        "ar-seeds-1-a0-0123abc-d5",
        "ar-seeds-x-a0-0123abcd-d5",
        "AR-seeds-1-a0-0123abcd-d5",
        "xar-seeds-1-a0-0123abcd-d5",
        "ar-seeds-1-a0-0123abcd-d5-extra",
        "ar-" + "j" * 41 + "-1-a0-0123abcd-d5",
    ],
)
def test_names_not_ours_parse_to_none(name: str) -> None:
    assert parse_name(name) is None


@given(st.text(max_size=80).filter(lambda s: not s.startswith(PREFIX)))
def test_anything_without_our_prefix_is_not_ours(name: str) -> None:
    assert parse_name(name) is None
