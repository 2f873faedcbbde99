"""Blocking calls and child processes off the trio thread on threads of our own
(protocols/offload.py, protocols/processes.py): results, exceptions, cancellation, and that the
threads end once no holder needs them."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest
import trio

from actor_run.protocols.offload import ThreadCache, to_thread
from actor_run.protocols.processes import open_process, run_process


def test_a_value_an_exception_and_the_callers_context_cross() -> None:
    async def main() -> None:
        assert await to_thread(lambda: threading.current_thread().name) != threading.current_thread().name
        with pytest.raises(ZeroDivisionError):
            await to_thread(lambda: 1 / 0)

    trio.run(main)


def test_a_cancelled_call_waits_for_its_thread_unless_abandoned() -> None:
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.3)  # a blocking call on a worker thread: what offload is for
        finished.set()

    async def main() -> None:
        with trio.move_on_after(0.05):
            await to_thread(slow)
        assert finished.is_set()  # the cancellation waited for the call
        finished.clear()
        with trio.move_on_after(0.05):
            await to_thread(slow, abandon_on_cancel=True)
        assert not finished.is_set()  # went on at once
        assert finished.wait(10)

    trio.run(main)


def test_idle_threads_end_when_the_last_holder_lets_go() -> None:
    cache = ThreadCache("offload-under-test", idle_s=60)
    cache.hold()
    done = threading.Event()
    cache.submit(done.set)
    assert done.wait(10)
    assert [t.name for t in threading.enumerate() if t.name.startswith("offload-under-test")]  # kept while held
    cache.release()
    assert not [t.name for t in threading.enumerate() if t.name.startswith("offload-under-test")]


def test_run_process_captures_feeds_and_reports_the_status() -> None:
    async def main() -> subprocess.CompletedProcess[bytes]:
        return await run_process(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"fed", capture_stdout=True,
                                 capture_stderr=True)

    done = trio.run(main)
    assert (done.returncode, done.stdout, done.stderr) == (3, b"fed", b"err\n")


def test_a_cancelled_run_process_delivers_the_cancel_and_reaps_the_child() -> None:
    delivered: list[int] = []

    async def main() -> None:
        async def deliver(proc: object) -> None:
            delivered.append(proc.pid)  # type: ignore[attr-defined]
            proc.terminate()  # type: ignore[attr-defined]

        with trio.move_on_after(0.5) as scope:
            await run_process(["sleep", "60"], deliver_cancel=deliver)
        assert scope.cancelled_caught

    trio.run(main)
    assert len(delivered) == 1
    with pytest.raises(ChildProcessError):  # reaped already: nothing left to wait for
        os.waitpid(delivered[0], 0)


def test_open_process_streams_both_ways() -> None:
    async def main() -> bytes:
        proc = await open_process(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None
        assert proc.stdout is not None
        await proc.stdin.send_all(b"hello")
        await proc.stdin.aclose()
        got = b""
        while chunk := await proc.stdout.receive_some():
            got += chunk
        assert await proc.wait() == 0
        await proc.stdout.aclose()
        return got

    assert trio.run(main) == b"hello"
