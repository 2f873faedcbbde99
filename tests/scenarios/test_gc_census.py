"""What a running job costs the cyclic collector (issue 30): the objects it tracks per running job,
counted through the real Runner on the sim's virtual machines. A full collection walks every one of
them with every thread stopped: at ten thousand jobs, seconds. A count, not a time
(bench/census.py measures the same at N=1000 and says by type)."""

from __future__ import annotations

import gc
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actor_run.protocols.messages import Event, JobStarted, Progress
from actor_run.supervisors.api.runner import Runner

# bench/RESULTS.md item 41: 180 on main before (three reactor tasks per job: the heartbeat's loop,
# its exit hint, the meter's budget guard timer), 120 after (the loop only)
MOST_PER_JOB = 130


class _Started:
    """A subscriber that keeps counts only (a list of events would be tracked objects too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: set[int] = set()
        self.polled: Counter[int] = Counter()  # progress lines seen after each job's start
        self.ready = threading.Event()
        self.want = 0

    def __call__(self, e: Event) -> None:
        with self.lock:
            if isinstance(e, JobStarted):
                self.started.add(e.seed)
            elif isinstance(e, Progress) and e.seed in self.started:
                self.polled[e.seed] += 1
            if sum(1 for n in self.polled.values() if n >= 2) >= self.want:
                self.ready.set()

    def wait(self, want: int) -> None:
        with self.lock:
            self.want = want
            self.ready.clear()
            if sum(1 for n in self.polled.values() if n >= 2) >= want:
                self.ready.set()
        assert self.ready.wait(60), f"{want} jobs running and polled: only {len(self.started)} started"


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_a_running_job_holds_a_bounded_number_of_tracked_objects(
    tmp_path: Path, state_dir: Path, sim_job: Callable[..., Any], regions: Callable[..., Any],
) -> None:
    first, more = 10, 40
    sim = {"regions": regions(("r", "A100", first + more, 1.0)), "virtual": True, "virtual_job_s": 600.0}
    jobs = [sim_job("census", "train", seed=i, sim=sim, poll_s=0.2, stall_after_s=600.0, setup_grace_s=600.0,
                    lost_after_s=600.0) for i in range(first + more)]
    seen = _Started()
    with Runner(out_dir=tmp_path / "out", state_dir=state_dir, concurrency=first + more, sweep_on_start=False,
                delete_timeout_s=30.0) as runner:
        runner.subscribe(seen)
        for job in jobs[:first]:  # what the first jobs make once (the cloud, its clocks) is in the baseline
            runner.submit(job)
        seen.wait(first)
        before = _tracked()
        for job in jobs[first:]:
            runner.submit(job)
        seen.wait(first + more)
        after = _tracked()
        runner.cancel()
        runner.wait(timeout=60)
    per_job = (after - before) / more
    assert 20 < per_job <= MOST_PER_JOB, f"{per_job:.1f} tracked objects per running job"
