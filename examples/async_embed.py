"""An asyncio application that awaits an actor-run job without blocking its event loop.

`async with Runner(...)` opens and closes the Runner on a thread of its own, so the loop runs on
while it waits for every machine to be deleted; a cancellation of the task (here: `wait_for`'s
timeout, had the job hung) deletes every machine before the block exits. `JobHandle.wait_async()`
wakes the loop when the job ends. examples/trio_embed.py is the same program in trio.

    python examples/async_embed.py [OUT_DIR]

The job here waits for a file that the loop itself writes while it awaits the job: the job can
only end because the loop kept running.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from actor_run import Job, JobEnded, Policy, Runner


async def run(out_dir: str | Path, state_dir: str | Path | None = None) -> tuple[JobEnded, int]:
    """Run one job and, meanwhile, keep the loop busy; the job's end and how often the loop ticked."""
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        job = Job(
            name="awaited",
            seed=1,
            command=f"while [ ! -e {go} ]; do sleep 0.05; done; echo released > $ACTOR_RUN_OUT/note.txt",
            timeout_s=120,
            policy=Policy(max_attempts=1, poll_s=0.2),
        )
        ticks = 0
        async with Runner(out_dir=out_dir, state_dir=state_dir) as runner:
            handle = runner.submit(job)

            async def heartbeat() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    if ticks == 3:
                        go.touch()  # only a running loop gets here
                    await asyncio.sleep(0.05)

            beating = asyncio.create_task(heartbeat())
            ended = await asyncio.wait_for(handle.wait_async(), timeout=300)
            beating.cancel()
    return ended, ticks


def main() -> int:
    ended, ticks = asyncio.run(run(sys.argv[1] if len(sys.argv) > 1 else "actor-run-out"))
    print(f"{ended.job}: {ended.outcome}; the loop ticked {ticks} times meanwhile")
    return 0 if ended.outcome == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
