"""Restart intensity, OTP's rule (supervisor.erl is the reference), as a pure function.

More than `intensity` restarts within `period_s` seconds and a supervisor gives up. The job
supervisor (tree/job.py) applies it to a job's attempts through tree/policy.py (the thrash guard);
the attempt actor's children follow the tree's fixed order (tree/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence


def restart_allowed(
    history: Sequence[float], now: float, *, intensity: int, period_s: float,
) -> tuple[bool, list[float]]:
    """OTP's rule: one more restart at `now` is allowed unless it makes more than `intensity`
    restarts within the last `period_s` seconds. Returns the decision and the pruned history
    including `now` (when allowed)."""
    recent = [t for t in history if now - t <= period_s]  # OTP keeps a restart exactly period_s old
    recent.append(now)
    return len(recent) <= intensity, recent
