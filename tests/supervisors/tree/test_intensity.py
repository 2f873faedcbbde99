"""supervisors/tree/intensity.py: OTP's restart intensity rule, as a pure function."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actor_run.supervisors.tree.intensity import restart_allowed

# --- restart intensity: a pure function ----------------------------------------------------------


def _replay(times: list[float], intensity: int, period_s: float) -> tuple[list[float], int | None]:
    """Feed restart times to the rule the way a supervisor does; the accepted ones and the index
    of the first refused (None if all were allowed)."""
    history: list[float] = []
    accepted: list[float] = []
    for i, now in enumerate(times):
        ok, history = restart_allowed(history, now, intensity=intensity, period_s=period_s)
        if not ok:
            return accepted, i
        accepted.append(now)
    return accepted, None


_gaps = st.lists(st.floats(min_value=0.0, max_value=10.0, allow_nan=False), min_size=1, max_size=40)


def _times(gaps: list[float]) -> list[float]:
    out, t = [], 1000.0
    for g in gaps:
        t += g
        out.append(t)
    return out


@given(
    gaps=_gaps,
    intensity=st.integers(min_value=1, max_value=6),
    period_s=st.floats(min_value=0.5, max_value=30.0, allow_nan=False),
)
def test_restart_intensity_never_allows_more_than_intensity_in_a_period(
    gaps: list[float], intensity: int, period_s: float
) -> None:
    times = _times(gaps)
    accepted, refused = _replay(times, intensity, period_s)
    # every accepted restart, with those accepted before it inside the period, is at most `intensity`
    for i, t in enumerate(accepted):
        assert sum(1 for u in accepted[: i + 1] if t - u <= period_s) <= intensity
    if refused is not None:
        # refused exactly when the restart would be one too many inside the period
        now = times[refused]
        assert sum(1 for u in accepted if now - u <= period_s) + 1 > intensity


@given(
    gaps=_gaps,
    intensity=st.integers(min_value=1, max_value=6),
    period_s=st.floats(min_value=0.5, max_value=30.0, allow_nan=False),
)
def test_restart_allowed_when_fewer_than_intensity_in_the_period(
    gaps: list[float], intensity: int, period_s: float
) -> None:
    times = _times(gaps)
    history: list[float] = []
    for now in times:
        recent = [u for u in history if now - u <= period_s]
        ok, new_history = restart_allowed(history, now, intensity=intensity, period_s=period_s)
        assert ok == (len(recent) < intensity)
        # the history kept is pruned to the period and includes this restart
        assert new_history == [*recent, now]
        if not ok:
            break
        history = new_history


def test_restart_intensity_examples() -> None:
    # 3 in 5 s: the 4th within 5 s is refused; once the first is older than 5 s, allowed again
    assert _replay([0.0, 1.0, 2.0, 3.0], 3, 5.0) == ([0.0, 1.0, 2.0], 3)
    assert _replay([0.0, 1.0, 2.0, 5.5], 3, 5.0) == ([0.0, 1.0, 2.0, 5.5], None)
    # as in OTP, a restart exactly period_s old still counts
    assert _replay([0.0, 1.0, 2.0, 5.0], 3, 5.0) == ([0.0, 1.0, 2.0], 3)
    # intensity 1: two restarts at the same moment are one too many
    assert _replay([7.0, 7.0], 1, 5.0) == ([7.0], 1)
