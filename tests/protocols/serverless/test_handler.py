"""The worker's handler on its own (no queue): the payload it refuses, the environment the job sees,
what it streams and returns, that it kills the command when closed and never blocks its event loop;
and the handler under RunPod's own SDK local API server (`--rp_serve_api`)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from fakes.zygote import Zygote

from actor_run.protocols.serverless import decode_blob, encode_blob, handle, pack, run, unpack


def payload(command: str, archive: bytes, **kw: Any) -> dict[str, Any]:
    return {"actor_run": 1, "command": command, "seed": 4, "attempt": 2, "env": {"MINE": "x"},
            "archive": encode_blob(archive), "stream_s": 0.05, **kw}


def chunks_of(inp: dict[str, Any], scratch: Path) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [c async for c in run(inp, scratch=scratch)]

    return asyncio.run(collect())


def test_the_job_sees_what_a_machines_job_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNPOD_AI_API_KEY", "the-workers-own")
    code = tmp_path / "code"
    code.mkdir()
    (code / "show.sh").write_text(
        'env | grep -E "^(ACTOR_RUN_|MINE=|RUNPOD)" | sort > "$ACTOR_RUN_OUT/env.txt"; pwd >> "$ACTOR_RUN_OUT/env.txt";'
        ' cat "$ACTOR_RUN_IN/words/w.txt" >> "$ACTOR_RUN_OUT/env.txt"\n')
    (tmp_path / "w.txt").write_text("hi\n")
    archive = pack([("code", code), ("in/words/w.txt", tmp_path / "w.txt")])
    chunks = chunks_of(payload("sh show.sh", archive, code=True), tmp_path)
    last = chunks[-1]
    assert last["exit_code"] == 0
    unpack(decode_blob(last["out"]), tmp_path / "got")
    lines = (tmp_path / "got" / "out" / "env.txt").read_text().splitlines()
    keys = {ln.split("=", 1)[0] for ln in lines if "=" in ln}
    seen = {"ACTOR_RUN_SEED", "ACTOR_RUN_ATTEMPT", "ACTOR_RUN_IN", "ACTOR_RUN_OUT", "ACTOR_RUN_PROGRESS", "MINE"}
    assert seen <= keys
    assert "ACTOR_RUN_SEED=4" in lines
    assert "ACTOR_RUN_ATTEMPT=2" in lines
    assert not any(k.startswith("RUNPOD") for k in keys)  # the worker's key is not the job's
    assert lines[-2].endswith("/code")  # the code snapshot is the working folder
    assert lines[-1] == "hi"
    assert list(tmp_path.glob("actor-run-job-*")) == []  # its folder is gone after the job


def test_progress_and_log_stream_as_they_come_and_a_non_zero_exit_ends_with_an_error_after_the_last_chunk(
    tmp_path: Path,
) -> None:
    cmd = 'echo "{\\"stage\\": \\"train\\"}" >> "$ACTOR_RUN_PROGRESS"; echo one; sleep 0.3; echo two; exit 5'
    chunks = chunks_of(payload(cmd, pack([])), tmp_path)
    assert chunks[-1] == {"error": "the job exited 5"}  # the platform marks the job FAILED
    chunks = chunks[:-1]
    assert "".join(c.get("progress", "") for c in chunks) == '{"stage": "train"}\n'
    assert "".join(c.get("log", "") for c in chunks) == "one\ntwo\n"
    assert chunks[0].get("log", "").startswith("one")  # streamed before the job ended
    assert chunks[-1]["exit_code"] == 5


def test_an_archive_that_does_not_match_its_hash_is_refused_before_anything_runs(tmp_path: Path) -> None:
    p = payload("touch ran", pack([]))
    p["archive"]["sha256"] = "0" * 64
    (only,) = chunks_of(p, tmp_path)
    assert "sha256" in only["error"]  # a terminal error, which the SDK passes through as the job's
    assert not list(tmp_path.rglob("ran"))


def test_a_member_reaching_outside_the_folder_is_not_extracted(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"evil"
        info = tarfile.TarInfo("../escaped.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("fine.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "dest").mkdir()
    unpack(buf.getvalue(), tmp_path / "dest")
    assert (tmp_path / "dest" / "fine.txt").read_bytes() == b"evil"
    assert not (tmp_path / "escaped.txt").exists()
    assert json.dumps(encode_blob(b"x"))  # a blob is plain JSON


# --- the command goes when the job does ------------------------------------------------------------

LOUD = "while :; do echo tick; sleep 0.05; done"
SILENT = "sleep 600"


def command_with_pids(pids: Path, body: str) -> str:
    """`body` in the foreground beside a background child; both pids in `pids` once they run."""
    return f'sleep 600 & echo $$ $! > "{pids}.tmp"; mv "{pids}.tmp" "{pids}"; {body}'


def read_pids(pids: Path) -> list[psutil.Process] | None:
    return [psutil.Process(int(p)) for p in pids.read_text().split()] if pids.exists() else None


async def wait_pids(pids: Path, within_s: float = 30.0) -> list[psutil.Process]:
    """The command's pids once written; polled on this loop's own tick, which runs only while the
    handler (in the same loop) leaves the loop free."""
    async with asyncio.timeout(within_s):
        while (procs := read_pids(pids)) is None:  # noqa: ASYNC110 - a file has no event to wait on
            await asyncio.sleep(0.02)
    return procs


def running(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def wait_gone(procs: list[psutil.Process], within_s: float) -> list[psutil.Process]:
    """Those of `procs` still running after `within_s` (waits on them, no sleep)."""
    end = time.monotonic() + within_s
    while (alive := running(procs)) and time.monotonic() < end:
        psutil.wait_procs(alive, timeout=min(0.2, max(0.0, end - time.monotonic())))
    return running(procs)


@pytest.mark.parametrize("body", [LOUD, SILENT], ids=["printing", "silent"])
def test_a_cancelled_task_kills_the_command_and_a_silent_one_never_blocks_the_loop(tmp_path: Path, body: str) -> None:
    pids = tmp_path / "pids"

    async def main() -> list[psutil.Process]:
        async def consume() -> None:
            async for _ in handle({"id": "j", "input": payload(command_with_pids(pids, body), pack([]))}):
                pass

        task = asyncio.create_task(consume())
        procs = await wait_pids(pids)  # this coroutine runs while the command is silent: the loop is free
        assert len(running(procs)) == 2
        task.cancel()  # what the SDK's stop_job does
        with pytest.raises(asyncio.CancelledError):
            await task
        return procs

    procs = asyncio.run(main())
    assert wait_gone(procs, 5.0) == []


def test_a_cancel_between_two_chunks_still_kills_the_command(tmp_path: Path) -> None:
    """The SDK awaits its stream post between two chunks: a cancel lands there, outside the generator,
    which is left suspended (not closed); the command goes all the same."""
    pids = tmp_path / "pids"

    async def main() -> list[psutil.Process]:
        gen = handle({"id": "j", "input": payload(command_with_pids(pids, LOUD), pack([]))})

        chunked = asyncio.Event()

        async def sdk_like() -> None:
            await gen.__anext__()
            chunked.set()
            await asyncio.sleep(600)  # the stream post, say: the generator waits at its yield meanwhile

        task = asyncio.create_task(sdk_like())
        await asyncio.wait_for(chunked.wait(), 30)
        procs = await wait_pids(pids)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gone = await asyncio.to_thread(wait_gone, procs, 5.0)
        assert gone == []
        await gen.aclose()
        return procs

    asyncio.run(main())


def test_closing_the_generator_kills_the_command(tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    async def main() -> list[psutil.Process]:
        gen = handle({"id": "j", "input": payload(command_with_pids(pids, LOUD), pack([]))})
        await gen.__anext__()
        procs = await wait_pids(pids)
        await gen.aclose()
        return procs

    assert wait_gone(asyncio.run(main()), 5.0) == []
    assert list(tmp_path.glob("actor-run-job-*")) == []


def test_chunks_stay_under_the_stream_limit_whatever_the_log_holds(tmp_path: Path) -> None:
    # NUL bytes escape to six characters in JSON: 256 KiB of them would post 1.5 MB
    cmd = "head -c 1000000 /dev/zero; head -c 1500000 /dev/zero | tr '\\0' x"
    chunks = chunks_of(payload(cmd, pack([])), tmp_path)
    sizes = [len(json.dumps({"output": c}, ensure_ascii=False).encode()) for c in chunks]
    assert max(sizes) <= 1_000_000
    log = "".join(c.get("log", "") for c in chunks)
    assert log == "\0" * 1_000_000 + "x" * 1_500_000
    assert chunks[-1]["exit_code"] == 0


def test_an_out_folder_over_a_chunk_without_a_store_is_a_transfer_failure_naming_its_size(tmp_path: Path) -> None:
    chunks = chunks_of(payload('head -c 2000000 /dev/urandom > "$ACTOR_RUN_OUT/big.bin"', pack([])), tmp_path)
    error = chunks[-1]["error"]
    assert error.startswith("actor-run transfer_failed: the job exited 0; out/ and progress.jsonl pack to 2")
    assert "bytes, over the" in error
    assert all(len(json.dumps(c)) <= 1_000_000 for c in chunks)


# --- under RunPod's SDK: its local API server ------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_sdk_local_api_server_runs_a_job_to_its_aggregated_result(tmp_path: Path, runpod_zygote: Zygote) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD")}
    argv = [sys.executable, "-m", "actor_run.protocols.serverless", "--rp_serve_api", "--rp_api_host", "127.0.0.1",
            "--rp_api_port", str(port)]
    stderr_r, stderr_w = os.pipe()
    with open(os.devnull, "wb") as null:  # forked from a process that has imported the SDK (fakes/zygote.py)
        proc = runpod_zygote.spawn(argv, env, str(tmp_path), null.fileno(), stderr_w)
    os.close(stderr_w)
    assert proc is not None
    stderr = os.fdopen(stderr_r)
    watchdog = threading.Timer(120, proc.kill)  # bounds the wait for its banner below
    watchdog.start()
    drain = threading.Thread(target=stderr.read, daemon=True)  # keeps its pipe drained past the banner
    try:
        for line in stderr:
            if "Uvicorn running on" in line:
                break
        drain.start()
        code = tmp_path / "code"
        code.mkdir()
        (code / "go.sh").write_text('echo \'{"stage": "train"}\' >> "$ACTOR_RUN_PROGRESS"; echo hi; '
                                    'echo r > "$ACTOR_RUN_OUT/r.txt"\n')
        body = {"input": payload("sh go.sh", pack([("code", code)]), code=True)}
        r = httpx.post(f"http://127.0.0.1:{port}/runsync", json=body, timeout=120)
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["status"] == "COMPLETED"
        chunks = job["output"]  # the SDK's aggregate: every chunk, in order, as a list
        assert isinstance(chunks, list)
        assert "".join(c.get("log", "") for c in chunks) == "hi\n"
        assert "".join(c.get("progress", "") for c in chunks) == '{"stage": "train"}\n'
        assert chunks[-1]["exit_code"] == 0
        unpack(decode_blob(chunks[-1]["out"]), tmp_path / "got")
        assert (tmp_path / "got" / "out" / "r.txt").read_text() == "r\n"
    finally:
        watchdog.cancel()
        proc.terminate()
        proc.wait(30)
        if drain.is_alive():
            drain.join(30)  # its pipe ends with the worker
        stderr.close()
