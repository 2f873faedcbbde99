"""Embedding actor-run: a batch built in code, run on this computer (the `local` cloud), its events
followed and its ends read. Only names from `actor_run` itself are used (its public API).

    python examples/embed.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from actor_run import Batch, Candidate, Event, JobEnded, Policy, Progress, Runner

HERE = Path(__file__).resolve().parent


def run(out_dir: str | Path, state_dir: str | Path | None = None) -> list[JobEnded]:
    """Three seeds of examples/trainer on the local cloud; the JobEnded of each, in seed order."""
    batch = Batch.build(
        name="embedded",
        command="python3 train.py --seed {seed} --steps 2 --step-seconds 0.05",
        code=HERE / "trainer",
        inputs={"data": HERE / "data" / "train.txt"},
        seeds=[1, 2, 3],
        timeout_s=300,
        policy=Policy(max_attempts=2, poll_s=0.2),
        candidates=[Candidate(cloud="local")],
    )
    steps: list[str] = []

    def follow(event: Event) -> None:  # on an actor thread: quick
        if isinstance(event, Progress) and event.stage == "train":
            steps.append(f"{event.job}/{event.seed}: step {event.line.get('step')}")

    with Runner(out_dir=out_dir, state_dir=state_dir, concurrency=batch.policy.concurrency) as runner:
        runner.subscribe(follow)
        handles = [runner.submit(job) for job in batch.jobs()]
        ended = [handle.result(timeout=600) for handle in handles]
    # leaving the `with` deleted every machine; the outputs are under out_dir/<run>/embedded/seed-<n>/
    # (out_dir/latest names the newest run)
    print(f"{len(steps)} progress steps seen")
    return ended


def main() -> int:
    ended = run(sys.argv[1] if len(sys.argv) > 1 else "actor-run-out")
    for e in ended:
        print(f"seed {e.seed}: {e.outcome} after {e.attempts} attempt(s), ${e.usd:.4f}, outputs in {e.out_dir}")
    return 0 if all(e.outcome == "succeeded" for e in ended) else 1


if __name__ == "__main__":
    sys.exit(main())
