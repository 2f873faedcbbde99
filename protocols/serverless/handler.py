"""The worker side of the `runpod-serverless` cloud: what a serverless image runs for each job.

`handle(job)` is a RunPod async generator handler, run by RunPod's own SDK
(`runpod.serverless.start`, with `return_aggregate_stream`). It unpacks the job's payload
(payload.py) into a fresh folder, runs the command there exactly as a machine's job runs (`sh -c`
in a session of its own, the code snapshot as its working folder, stdout and stderr into the log,
the same `ACTOR_RUN_*` environment), and yields, every `stream_s`, the new progress lines and the
new tail of the log, each chunk under `CHUNK_LIMIT` as JSON::

    {"progress": "<whole new lines of progress.jsonl>", "log": "<new log text>"}

then once, at the end, `out/` and `progress.jsonl` archived with the exit code::

    {"exit_code": 0, "out": {"sha256": ..., "inline": ...}}      # or {"sha256", "size", "put": true}

A failure that is not the job's own ends the stream with a terminal `{"error": <marker> ...}`
(payload.py: `INPUT_ERROR`, `TRANSFER_ERROR`, `PREEMPTED_ERROR`), which the SDK posts as the job's
error unprefixed; a non-zero exit ends it with `{"error": "the job exited <n>"}` after the last chunk,
so the platform marks the job FAILED (and the controller, which has the chunk, still fetches out/).

The generator awaits between polls of the command, so a silent command never blocks the SDK's
event loop (its job-stop long poll and its SIGTERM handling go on). The command's process group is
killed (SIGKILL) when:
- the SDK cancels the job's task (a `/cancel` reaching the worker through its stop channel): the
  `CancelledError` lands in the generator's `finally`, or, when it lands in the SDK's own await
  between two chunks, the task's done-callback kills it;
- the generator is closed (`aclose`, or collected) before the command ended;
- the worker gets SIGTERM (the platform stopping it): a handler chained before the SDK's own (in
  the SDK's worker loop only, which RUNPOD_WEBHOOK_GET_JOB selects, as it does for the SDK).

Run as a program::

    python -m actor_run.protocols.serverless                 # RunPod's SDK worker loop
    python -m actor_run.protocols.serverless --rp_serve_api  # the SDK's local API server
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from types import FrameType
from typing import Any

from actor_run.protocols.serverless.payload import (
    CHUNK_LIMIT,
    OUT_INLINE_LIMIT,
    PREEMPTED_ERROR,
    TRANSFER_ERROR,
    VERSION,
    PayloadError,
    decode_blob,
    encode_blob,
    pack,
    put_blob,
    sha256,
    unpack,
)

MAX_LOG_CHUNK = 256 * 1024  # bytes of log (and of progress) read into one chunk; the rest waits for the next
TICK_S = 0.1  # how often the command is polled for its exit (the chunks still come every stream_s)

# the commands running in this worker (pid -> process): what a SIGTERM kills
_running: dict[int, subprocess.Popen[bytes]] = {}
_terminated = False  # a SIGTERM came: the job's end is the worker's, not the job's
_sigterm_chained = False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """The command's whole process group, at once (it runs in a session of its own)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _chain_sigterm() -> None:
    """Kill every running command on SIGTERM, then do what the handler before ours (the SDK's
    graceful shutdown) does. Installed at the first job: the SDK installs its own after `start`."""
    global _sigterm_chained
    if _sigterm_chained or "RUNPOD_WEBHOOK_GET_JOB" not in os.environ:  # only in the SDK's worker loop
        return
    before = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        global _terminated
        _terminated = True
        for proc in list(_running.values()):
            _kill(proc)
        if callable(before):
            before(signum, frame)
        elif before == signal.SIG_DFL:
            raise SystemExit(128 + signum)

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread (the SDK's local API server runs handlers elsewhere)
        return
    _sigterm_chained = True


def _env(inp: dict[str, Any], work: Path, code: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD_")}  # the worker's key stays its own
    env.update({str(k): str(v) for k, v in dict(inp.get("env") or {}).items()})
    env.update({
        "ACTOR_RUN_SEED": str(inp.get("seed", 0)), "ACTOR_RUN_ATTEMPT": str(inp.get("attempt", 0)),
        "ACTOR_RUN_IN": str(work / "in"), "ACTOR_RUN_OUT": str(work / "out"),
        "ACTOR_RUN_PROGRESS": str(work / "progress.jsonl"),
        "ACTOR_RUN_CWD": str(code if code is not None else work / "out"),
    })
    if (work / "in" / "resume").is_dir():
        env["ACTOR_RUN_RESUME"] = str(work / "in" / "resume" / "progress.json")
    return env


class _Tail:
    """The new bytes of a growing file since the last read (whole lines only, when `lines`)."""

    def __init__(self, path: Path, *, lines: bool) -> None:
        self.path, self.lines, self.at = path, lines, 0

    def read(self, most: int) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.at)
                data = f.read(most)
        except FileNotFoundError:
            return ""
        if self.lines and (len(data) < most or b"\n" in data):  # whole lines, unless one is longer than `most`
            data = data[: data.rfind(b"\n") + 1]
        self.at += len(data)
        return data.decode(errors="replace")


def _size(chunk: dict[str, Any]) -> int:
    return len(json.dumps({"output": chunk}, ensure_ascii=False).encode())  # as the SDK posts it


def _next_chunk(progress: _Tail, log: _Tail) -> dict[str, str] | None:
    """What is new, as one chunk under CHUNK_LIMIT (text that escapes long in JSON is read in less)."""
    most = MAX_LOG_CHUNK
    while True:
        at = progress.at, log.at
        p, t = progress.read(most), log.read(most)
        if not (p or t):
            return None
        chunk = {"progress": p, "log": t}
        if _size(chunk) <= CHUNK_LIMIT or most <= 4096:  # 2 x 4096 bytes escape to at most ~50 KB
            return chunk
        progress.at, log.at = at
        most //= 2


async def run(inp: dict[str, Any], *, scratch: Path | None = None) -> AsyncGenerator[dict[str, Any], None]:
    """Run one payload; yields the stream chunks, the last one with the exit code and out/ (or a
    terminal `{"error": ...}`)."""
    if inp.get("actor_run") != VERSION:
        yield {"error": f"not an actor-run payload of version {VERSION}"}
        return
    command = inp.get("command")
    if not isinstance(command, str) or not command:
        yield {"error": "the payload has no command"}
        return
    stream_s = float(inp.get("stream_s", 1.0))
    _chain_sigterm()
    work = Path(tempfile.mkdtemp(prefix="actor-run-job-", dir=scratch))
    proc: subprocess.Popen[bytes] | None = None
    task = asyncio.current_task()

    def on_task_done(_: object) -> None:  # the SDK's task ended (a cancel between two chunks)
        if proc is not None:
            _kill(proc)

    try:
        try:  # the download (up to minutes) must not hold the event loop
            await asyncio.to_thread(_prepare, inp, work)
        except PayloadError as exc:  # InputError's text starts with INPUT_ERROR
            yield {"error": str(exc)}
            return
        code = work / "code" if inp.get("code") and (work / "code").is_dir() else None
        env = _env(inp, work, code)
        progress = _Tail(work / "progress.jsonl", lines=True)
        log = _Tail(work / "log.txt", lines=False)
        if _terminated:  # the SIGTERM came while the job was being unpacked: it never starts
            yield {"error": f"{PREEMPTED_ERROR}the worker was stopped (SIGTERM) before the job started"}
            return
        proc = _spawn(command, env, work / "log.txt")
        _running[proc.pid] = proc
        if task is not None:
            task.add_done_callback(on_task_done)
        loop = asyncio.get_running_loop()
        due = loop.time() + stream_s
        while proc.poll() is None:
            await asyncio.sleep(min(TICK_S, stream_s))
            if loop.time() >= due:
                due = loop.time() + stream_s
                chunk = _next_chunk(progress, log)
                if chunk is not None:
                    yield chunk
        rc = proc.wait()
        while (chunk := _next_chunk(progress, log)) is not None:  # what was written before the exit
            yield chunk
        if _terminated:
            yield {"error": f"{PREEMPTED_ERROR}the worker was stopped (SIGTERM) while the job ran (it exited {rc})"}
            return
        out = await asyncio.to_thread(pack, [("out", work / "out"), ("progress.jsonl", work / "progress.jsonl")])
        if len(out) <= OUT_INLINE_LIMIT:
            yield {"exit_code": rc, "out": encode_blob(out)}
        else:
            put = (inp.get("out_put") or {}).get("url")
            if not isinstance(put, str):
                yield {"error": f"{TRANSFER_ERROR}the job exited {rc}; out/ and progress.jsonl pack to {len(out)} "
                                f"bytes, over the {OUT_INLINE_LIMIT} a RunPod stream chunk carries inline, and "
                                "no object store was named to put them in"}
                return
            try:
                await asyncio.to_thread(put_blob, put, out)
            except OSError as exc:
                yield {"error": f"{TRANSFER_ERROR}the job exited {rc}; out/ ({len(out)} bytes): {exc}"}
                return
            yield {"exit_code": rc, "out": {"sha256": sha256(out), "size": len(out), "put": True}}
        if rc != 0:
            yield {"error": f"the job exited {rc}"}
    finally:
        if proc is not None:
            _kill(proc)  # cancelled, closed, or SIGTERM: the command goes with the job
            with contextlib.suppress(ChildProcessError):
                proc.wait()
            _running.pop(proc.pid, None)
            if task is not None:
                task.remove_done_callback(on_task_done)
        shutil.rmtree(work, ignore_errors=True)


def _spawn(command: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`sh -c command` in a session of its own (its process group is what a stop kills), output to the log."""
    with open(log, "ab") as log_file:
        return subprocess.Popen(["sh", "-c", command], cwd=env["ACTOR_RUN_CWD"], env=env, stdin=subprocess.DEVNULL,
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _prepare(inp: dict[str, Any], work: Path) -> None:
    """The job's folder from its payload (in a thread: the archive may be downloaded)."""
    unpack(decode_blob(inp.get("archive")), work)
    (work / "out").mkdir(exist_ok=True)
    (work / "in").mkdir(exist_ok=True)
    (work / "request.json").write_text(str(inp.get("request", "{}")))
    (work / "progress.jsonl").touch()


async def handle(job: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
    """RunPod's async generator handler: `job["input"]` is the payload."""
    gen = run(dict(job.get("input") or {}))
    try:
        async for chunk in gen:
            yield chunk
    finally:
        await gen.aclose()


def main() -> int:
    try:
        import runpod  # type: ignore[import-untyped]  # only in the worker's image (and the test extra)
    except ImportError:
        sys.stderr.write("actor-run handler: the `runpod` package is not installed (pip install runpod)\n")
        return 2
    runpod.serverless.start({"handler": handle, "return_aggregate_stream": True})
    return 0
