"""A trio program that awaits an actor-run job without blocking its event loop.

`async with Runner(...)` opens and closes the Runner on a thread of its own; a cancelled scope
around it (here `trio.fail_after`, had the job hung) deletes every machine before the block exits,
shielded from the cancellation that caused it. examples/async_embed.py is the same in asyncio.

    python examples/trio_embed.py [OUT_DIR]

The job waits for a file that a task of this program writes while another awaits the job: the job
can only end because the loop kept running.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

from actor_run import Job, JobEnded, Policy, Runner


async def run(out_dir: str | Path, state_dir: str | Path | None = None) -> tuple[JobEnded, int]:
    """Run one job and, meanwhile, keep the loop busy; the job's end and how often the loop ticked."""
    ticks = 0
    with tempfile.TemporaryDirectory() as tmp:
        go = Path(tmp) / "go"
        job = Job(
            name="awaited",
            seed=1,
            command=f"while [ ! -e {go} ]; do sleep 0.05; done; echo released > $ACTOR_RUN_OUT/note.txt",
            timeout_s=120,
            policy=Policy(max_attempts=1, poll_s=0.2),
        )

        async def heartbeat() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                if ticks == 3:
                    go.touch()  # only a running loop gets here
                await trio.sleep(0.05)

        with trio.fail_after(300):
            async with Runner(out_dir=out_dir, state_dir=state_dir) as runner, trio.open_nursery() as nursery:
                nursery.start_soon(heartbeat)
                ended = await runner.submit(job).wait_async()
                nursery.cancel_scope.cancel()
    return ended, ticks


def main() -> int:
    ended, ticks = trio.run(run, sys.argv[1] if len(sys.argv) > 1 else "actor-run-out")
    print(f"{ended.job}: {ended.outcome}; the loop ticked {ticks} times meanwhile")
    return 0 if ended.outcome == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
