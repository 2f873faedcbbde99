"""supervisors/api/runner.py as a host embeds it: `async with Runner` in asyncio and in trio, cancelled
by the host while its jobs run (the machines and the jobs' processes must be gone when the block
exits), and a thread's `result()` that an interrupt reaches."""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio
from waits import poll

from actor_run.protocols.specs import Job
from actor_run.supervisors.api.runner import Runner

SEEDS = (1, 2)


def jobs(tmp_path: Path, local_job: Any) -> list[Job]:
    """Two local jobs that each write their pid, then sleep for ten minutes."""
    return [local_job("held", f"echo $$ > {tmp_path}/pid-{seed}; exec sleep 600", seed=seed) for seed in SEEDS]


def pids_written(tmp_path: Path) -> list[int] | None:
    files = [tmp_path / f"pid-{seed}" for seed in SEEDS]
    texts = [f.read_text().strip() if f.exists() else "" for f in files]
    return [int(t) for t in texts] if all(texts) else None


def machines(state_dir: Path) -> list[str]:
    return sorted(p.name for p in (state_dir / "local").glob("*.json")) if (state_dir / "local").is_dir() else []


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def runner(tmp_path: Path, state_dir: Path) -> Runner:
    return Runner(out_dir=tmp_path / "out", state_dir=state_dir, delete_timeout_s=30.0, sweep_on_start=False)


def test_asyncio_wait_for_cancels_the_block_and_every_machine_is_gone_when_it_exits(
        tmp_path: Path, state_dir: Path, local_job: Any) -> None:
    seen: dict[str, Any] = {}

    async def block() -> None:
        async with runner(tmp_path, state_dir) as r:
            for job in jobs(tmp_path, local_job):
                r.submit(job)
            await asyncio.Event().wait()  # until the host cancels this task

    async def host() -> None:
        task = asyncio.ensure_future(block())
        seen["pids"] = await asyncio.to_thread(poll, lambda: pids_written(tmp_path), 60, "both jobs to start")
        assert len(machines(state_dir)) == 2  # both machines held while the jobs run
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(task, timeout=3)  # cancels the task after 3 s, then waits for it
        # the block has exited: what it started is gone already, not later
        seen["machines"], seen["alive"] = machines(state_dir), alive(seen["pids"])

    asyncio.run(host())
    assert seen["machines"] == []
    assert seen["alive"] == []


def test_a_second_asyncio_cancel_does_not_skip_the_deletion(tmp_path: Path, state_dir: Path, local_job: Any) -> None:
    seen: dict[str, Any] = {}

    async def block() -> None:
        async with runner(tmp_path, state_dir) as r:
            for job in jobs(tmp_path, local_job):
                r.submit(job)
            await asyncio.Event().wait()

    async def host() -> None:
        task = asyncio.ensure_future(block())
        seen["pids"] = await asyncio.to_thread(poll, lambda: pids_written(tmp_path), 60, "both jobs to start")
        task.cancel()
        await asyncio.sleep(0)  # the task is in its close now
        task.cancel()  # and is cancelled again while it deletes
        with pytest.raises(asyncio.CancelledError):
            await task
        seen["machines"], seen["alive"] = machines(state_dir), alive(seen["pids"])

    asyncio.run(host())
    assert seen["machines"] == []
    assert seen["alive"] == []


def test_trio_move_on_after_cancels_the_block_and_every_machine_is_gone_when_it_exits(
        tmp_path: Path, state_dir: Path, local_job: Any) -> None:
    seen: dict[str, Any] = {}

    async def host() -> None:
        with trio.move_on_after(3600) as scope:
            async with runner(tmp_path, state_dir) as r:
                for job in jobs(tmp_path, local_job):
                    r.submit(job)
                seen["pids"] = await trio.to_thread.run_sync(poll, lambda: pids_written(tmp_path), 60,
                                                             "both jobs to start")
                assert len(machines(state_dir)) == 2
                scope.deadline = trio.current_time() + 3  # move_on_after(3) from here
                await trio.sleep_forever()
        seen["caught"] = scope.cancelled_caught
        seen["machines"], seen["alive"] = machines(state_dir), alive(seen["pids"])

    trio.run(host)
    assert seen["caught"]
    assert seen["machines"] == []
    assert seen["alive"] == []


def test_async_with_works_in_both_libraries_and_wait_async_gives_the_end(
        tmp_path: Path, state_dir: Path, local_job: Any) -> None:
    async def run_one(seed: int) -> str:
        async with runner(tmp_path, state_dir) as r:
            ended = await r.submit(local_job("quick", "true", seed=seed)).wait_async()
            return ended.outcome

    assert asyncio.run(run_one(1)) == "succeeded"
    assert trio.run(run_one, 2) == "succeeded"


def test_result_is_interrupted_within_a_second_by_an_exception_raised_into_its_thread(
        tmp_path: Path, state_dir: Path, local_job: Any) -> None:
    got: dict[str, Any] = {}
    with runner(tmp_path, state_dir) as r:
        handle = r.submit(local_job("held", "exec sleep 600", seed=1))
        waiting = threading.Event()

        def wait() -> None:
            waiting.set()
            try:
                handle.result()
            except KeyboardInterrupt:
                got["at"] = time.monotonic()

        t = threading.Thread(target=wait, name="host-waiter")
        t.start()
        waiting.wait(10)
        sent = time.monotonic()
        # what Ray's non-force cancel and a Celery soft limit do to a worker thread
        assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident or 0),
                                                          ctypes.py_object(KeyboardInterrupt)) == 1
        t.join(10)
        assert not t.is_alive()
        assert got["at"] - sent < 1.0
        assert not handle.done()  # the job goes on: the interrupt stopped the wait, not the job
    assert machines(state_dir) == []
