"""The worker side of the `runpod-serverless` cloud: what a serverless image runs for each job.

`handle(job)` is a RunPod generator handler. It unpacks the job's payload (payload.py) into a
fresh folder, runs the command there exactly as a machine's job runs (`sh -c`, the code snapshot
as its working folder, stdout and stderr into the log, the same `ACTOR_RUN_*` environment), and
yields, every `stream_s`, the new progress lines and the new tail of the log::

    {"progress": "<whole new lines of progress.jsonl>", "log": "<new log text>"}

then once, at the end, `out/` and `progress.jsonl` archived with the exit code::

    {"exit_code": 0, "out": {"sha256": ..., "inline": ...}}

and returns. A non-zero exit raises `JobExited` after that last chunk, so the platform marks the
job FAILED (and the controller, which has the chunk, still fetches what the job left in out/).

Run as a program::

    python -m actor_run.protocols.serverless          # RunPod's SDK loop (needs `runpod`)
    python -m actor_run.protocols.serverless --once   # one job: its JSON on stdin, each
                                                       # chunk as a JSON line on stdout
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actor_run.protocols.serverless.payload import VERSION, PayloadError, decode_blob, encode_blob, pack, unpack

MAX_LOG_CHUNK = 256 * 1024  # a RunPod stream chunk is at most 1 MB; the log's excess waits for the next


class JobExited(Exception):
    """The job's command exited non-zero: the platform marks the queue job FAILED."""


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

    def __init__(self, path: Path, *, lines: bool, most: int = 0) -> None:
        self.path, self.lines, self.most, self.at = path, lines, most, 0

    def read(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.at)
                data = f.read(self.most) if self.most else f.read()
        except FileNotFoundError:
            return ""
        if self.lines:
            data = data[: data.rfind(b"\n") + 1]
        self.at += len(data)
        return data.decode(errors="replace")


def run(inp: dict[str, Any], *, scratch: Path | None = None) -> Iterator[dict[str, Any]]:
    """Run one payload; yields the stream chunks, the last one with the exit code and out/."""
    if inp.get("actor_run") != VERSION:
        raise PayloadError(f"not an actor-run payload of version {VERSION}")
    command = inp.get("command")
    if not isinstance(command, str) or not command:
        raise PayloadError("the payload has no command")
    stream_s = float(inp.get("stream_s", 1.0))
    work = Path(tempfile.mkdtemp(prefix="actor-run-job-", dir=scratch))
    try:
        unpack(decode_blob(inp.get("archive")), work)
        (work / "out").mkdir(exist_ok=True)
        (work / "in").mkdir(exist_ok=True)
        (work / "request.json").write_text(str(inp.get("request", "{}")))
        (work / "progress.jsonl").touch()
        code = work / "code" if inp.get("code") and (work / "code").is_dir() else None
        env = _env(inp, work, code)
        progress = _Tail(work / "progress.jsonl", lines=True)
        log = _Tail(work / "log.txt", lines=False, most=MAX_LOG_CHUNK)
        with open(work / "log.txt", "ab") as log_file:
            proc = subprocess.Popen(["sh", "-c", command], cwd=env["ACTOR_RUN_CWD"], env=env, stdin=subprocess.DEVNULL,
                                    stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=stream_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                p, t = progress.read(), log.read()
                if p or t:
                    yield {"progress": p, "log": t}
        finally:
            if proc.poll() is None:  # the generator was closed (the job cancelled): the command goes too
                os.killpg(proc.pid, 9)
                proc.wait()
        while True:  # what was written before the exit, in chunks of bounded size
            p, t = progress.read(), log.read()
            if not (p or t):
                break
            yield {"progress": p, "log": t}
        out = pack([("out", work / "out"), ("progress.jsonl", work / "progress.jsonl")])
        yield {"exit_code": rc, "out": encode_blob(out)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rc != 0:
        raise JobExited(f"the job exited {rc}")


def handle(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """RunPod's generator handler: `job["input"]` is the payload."""
    yield from run(dict(job.get("input") or {}))


def run_once(stdin: Any, stdout: Any) -> int:
    """One job from `stdin` (the queue job's JSON): each chunk as `{"stream": chunk}`, then
    `{"output": {"exit_code": n}}` or `{"error": text}`, one JSON line each."""
    job = json.load(stdin)
    last: dict[str, Any] = {}
    try:
        for chunk in handle(job):
            stdout.write(json.dumps({"stream": chunk}) + "\n")
            stdout.flush()
            last = chunk
    except (JobExited, PayloadError) as exc:
        stdout.write(json.dumps({"error": str(exc)}) + "\n")
        return 1
    except Exception as exc:  # what RunPod's SDK does with a handler's raise: the job FAILED, with the text
        stdout.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    stdout.write(json.dumps({"output": {"exit_code": last.get("exit_code"), "out": last.get("out")}}) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--once"]:
        return run_once(sys.stdin, sys.stdout)
    try:
        import runpod  # type: ignore[import-not-found]  # only in the worker's image
    except ImportError:
        sys.stderr.write("actor-run handler: the `runpod` package is not installed (pip install runpod)\n")
        return 2
    runpod.serverless.start({"handler": handle, "return_aggregate_stream": True})
    return 0
