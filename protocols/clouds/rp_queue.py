"""The workspace of a RunPod serverless endpoint: the attempt's run is one queue job.

There is no machine to log into. `publish_*` keep the code snapshot and the inputs' paths here;
`start` packs them into one content-addressed archive (payload.py) (inline up to the limit; above
it, put once under its sha256 in the user's object store, the payload carrying a presigned GET
URL, its size and hash), submits `/run` and hands the
job's handle `{endpoint_id, job_id}` to `record` (the ledger) before it returns; `poll` reads
`/stream/{job}` (its status and the new chunks the handler yielded), and `/health` while the job
is queued; `fetch` unpacks the `out/` archive of the job's last chunk. `aclose` (the lease's, before
the endpoint is deleted) sends `/cancel` for a job still out.

What a poll makes of the platform's answers (contract §11):

| answer | result |
|---|---|
| IN_QUEUE: no worker running for `queue_grace_s`, or throttled for `throttled_grace_s` | Refused(no_capacity) |
| IN_QUEUE, unhealthy workers for `unhealthy_grace_s` and none running | Refused(launch_failed) |
| IN_PROGRESS / RUNNING | running (the heartbeat judges the stall window from the chunks) |
| COMPLETED, or FAILED after the handler's last chunk | exited, with the job's exit code |
| FAILED, the worker could not have the archive (download, size, hash) | Refused(input) |
| FAILED, out/ could not come back (over the stream chunk with no store, the put failed) | Refused(transfer_failed) |
| FAILED, the worker was stopped (SIGTERM) while the job ran | MachineGone (preempted) |
| FAILED otherwise (the handler's own error) | Refused(job_failed) |

The worker's markers (payload.py `worker_error`) are read wherever RunPod's SDK puts them: a
terminal `{"error": ...}` the handler yielded (passed through as it is), or a handler that raised
(`handler: <message> \ntraceback: ...`, or the JSON `error_message` of a plain handler).
An `out/` above what a stream chunk carries comes back through the object store: `start` hands the
worker a presigned PUT URL for a key of its own (kept in the handle, so a resuming controller finds
it) and `fetch` gets it from there and checks size and hash.
| CANCELLED, TIMED_OUT (by the platform) | MachineGone (preempted) |
| 404 for a job we submitted (its TTL passed) | Refused(unreachable) |
"""

from __future__ import annotations

import math
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec
import trio

from actor_run.protocols.clouds.object_store import ObjectStore
from actor_run.protocols.clouds.rp_api import RunPodApi
from actor_run.protocols.failures import Code, MachineGone, Refused, Unreachable
from actor_run.protocols.hosts.content import tree_size
from actor_run.protocols.hosts.workspace import MAX_LOG_PER_POLL, HostBeat, Launch, PollResult, Record
from actor_run.protocols.offload import to_thread
from actor_run.protocols.serverless import (
    INLINE_LIMIT,
    INPUT_ERROR,
    PREEMPTED_ERROR,
    TRANSFER_ERROR,
    PayloadError,
    decode_blob,
    encode_blob,
    pack,
    tar_folder,
    unpack,
    url_blob,
    worker_error,
)
from actor_run.protocols.serverless.payload import sha256

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})


class Graces(msgspec.Struct, frozen=True, kw_only=True):
    queue_grace_s: float = 300.0
    throttled_grace_s: float = 300.0
    unhealthy_grace_s: float = 240.0
    stream_s: float = 1.0  # how often the handler yields what is new
    ttl_s: float = 24 * 3600.0


class Handle(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What the ledger keeps of a queue job: enough for any process to follow it."""

    endpoint_id: str
    job_id: str
    out_key: str = ""  # where the worker puts an out/ too large for a chunk (in the object store)


class _Job:
    """What this controller knows of one queue job."""

    def __init__(self, handle: Handle, submitted: float | None) -> None:
        self.handle = handle
        self.submitted = submitted  # trio's clock; None: reattached, counted from its first poll
        self.status = "IN_QUEUE"
        self.progress, self.log = bytearray(), bytearray()
        self.progress_base = self.log_base = 0  # offsets of the buffers' first bytes
        self.exit_code: int | None = None
        self.out: dict[str, Any] | None = None
        self.executed_s = -1.0
        self.throttled_since: float | None = None
        self.unhealthy_since: float | None = None
        self.terminal_checked = False


class ServerlessWorkspace:
    def __init__(self, api: RunPodApi, endpoint_id: str, graces: Graces, deadline: float, *,
                 store: ObjectStore | None = None, inline_limit: int = INLINE_LIMIT) -> None:
        self.api, self.endpoint_id, self.graces, self.deadline = api, endpoint_id, graces, deadline
        self.store, self.inline_limit = store, inline_limit
        self.root = f"runpod-serverless:{endpoint_id}"
        self.code: dict[str, bytes] = {}  # digest -> tar of the snapshot (its folder is gone after publish)
        self.inputs: dict[str, Path] = {}  # digest -> the local file or folder
        self.jobs: dict[str, _Job] = {}  # work -> its queue job

    async def prepare(self) -> str:
        return self.root

    def work_dir(self, job: str, seed: int, attempt: int) -> str:
        return f"{self.root}/{job}/{seed}/a{attempt}"

    async def publish_code(self, snapshot: Path, digest: str, tag: str) -> int:
        if digest not in self.code:
            self.code[digest] = await to_thread(tar_folder, snapshot)
        return 0  # nothing is sent until the job is submitted

    async def publish_input(self, name: str, path: Path, digest: str, tag: str) -> int:
        self.inputs[digest] = path
        return 0

    def _pack(self, launch: Launch) -> bytes:
        entries: list[tuple[str, Path | bytes]] = []
        if launch.code:
            entries.append(("code", self.code[launch.code]))
        for ref in launch.inputs:
            entries.append((f"in/{ref.name}/{ref.basename}", self.inputs[ref.sha256]))
        if launch.resume is not None:
            entries.append(("in/resume", self.inputs[launch.resume.sha256]))
        return pack(entries)

    async def start(self, launch: Launch, record: Record | None = None) -> int:
        archive = await to_thread(self._pack, launch)
        if len(archive) <= self.inline_limit:
            blob: dict[str, Any] = encode_blob(archive)
        elif self.store is not None:
            digest = sha256(archive)
            url = await self.store.share(archive, digest, self.deadline)
            blob = url_blob(url, digest, len(archive))
        else:
            sizes = ", ".join(f"{r.name} {tree_size(self.inputs[r.sha256])} bytes" for r in launch.inputs)
            raise Refused(Code.INPUT, f"the job's code and inputs pack to {len(archive)} bytes, over the "
                          f"{self.inline_limit} a RunPod /run payload carries inline ({sizes or 'code only'}); "
                          "name an S3-compatible store in [clouds.runpod-serverless] object_store "
                          "(network volumes are not supported for this cloud yet)")
        request = launch.request.decode(errors="replace")
        seed = launch.env.get("ACTOR_RUN_SEED", "0")
        attempt = launch.env.get("ACTOR_RUN_ATTEMPT", "0")
        env = {k: v for k, v in launch.env.items() if k not in ("ACTOR_RUN_SEED", "ACTOR_RUN_ATTEMPT", "ACTOR_RUN_GPU")}
        payload: dict[str, Any] = {
            "actor_run": 1, "command": launch.command, "seed": int(seed), "attempt": int(attempt), "env": env,
            "request": request, "archive": blob, "code": bool(launch.code), "stream_s": self.graces.stream_s}
        out_key = ""
        if self.store is not None:  # an out/ over a stream chunk goes there (the worker gets only a URL)
            out_key = self.store.out_key(uuid.uuid4().hex)
            payload["out_put"] = {"url": await self.store.share_put(out_key, self.deadline)}
        left_ms = max(5_000, int((self.deadline - time.time()) * 1000))
        body = {"input": payload, "policy": {"executionTimeout": left_ms, "ttl": int(self.graces.ttl_s * 1000)}}
        answer = await self.api.queue("POST", self.endpoint_id, "run", body)
        if answer.status >= 300 or not isinstance(answer.body, dict) or not answer.body.get("id"):
            code = Code.INPUT if answer.status in (400, 413) else Code.LAUNCH_FAILED
            raise Refused(code, f"runpod /run: {answer.status} {answer.detail()}")
        handle = Handle(endpoint_id=self.endpoint_id, job_id=str(answer.body["id"]), out_key=out_key)
        self.jobs[launch.work] = _Job(handle, trio.current_time())
        if record is not None:
            await record(msgspec.json.encode(handle).decode())
        return 0  # no process of ours: the handle is the job's name

    def attach(self, work: str, handle: str) -> None:
        """A queue job an earlier controller submitted: follow it by its recorded handle."""
        h = msgspec.json.decode(handle, type=Handle)
        self.jobs[work] = _Job(h, None)

    async def started(self, work: str) -> tuple[int, float]:
        """A queue job is known only by the handle the submit made durable before it returned: a
        row without one was never followed, and the provider offers no listing by our name to
        find a submit whose answer was lost with its controller (the endpoint's own timeout ends it)."""
        return 0, 0.0

    def _job(self, work: str) -> _Job:
        job = self.jobs.get(work)
        if job is None:
            raise Refused(Code.INTERNAL, f"no queue job is known for {work}")
        return job

    async def poll(self, work: str, pid: int, progress_at: int, log_at: int,
                   log_max: int = MAX_LOG_PER_POLL) -> PollResult:
        """All that is new (`log_max` aside: a queue job's stream is held here until read)."""
        job = self._job(work)
        if job.status not in TERMINAL:
            answer = await self.api.queue("GET", job.handle.endpoint_id, f"stream/{job.handle.job_id}")
            self._expired_or_fail(answer.status, answer.detail(), job)
            body = answer.body if isinstance(answer.body, dict) else {}
            for chunk in body.get("stream") or []:
                self._take(job, chunk.get("output") if isinstance(chunk, dict) else None)
            job.status = str(body.get("status") or job.status)
            if job.status == "IN_QUEUE":
                await self._judge_queue(job)
        if job.status in TERMINAL and not job.terminal_checked:
            await self._terminal(job)
        state = "exited" if job.status in ("COMPLETED", "FAILED") else "running"
        p = bytes(job.progress[max(0, progress_at - job.progress_base):])
        lg = bytes(job.log[max(0, log_at - job.log_base):])
        # what the heartbeat has read is dropped (it reads each byte once)
        self._trim(job, progress_at, log_at)
        return PollResult(state=state, exit_code=job.exit_code if state == "exited" else None, progress=p, log=lg,
                          progress_size=job.progress_base + len(job.progress), log_size=job.log_base + len(job.log),
                          billed_s=job.executed_s if state == "exited" else -1.0)

    @staticmethod
    def _trim(job: _Job, progress_at: int, log_at: int) -> None:
        cut = min(max(0, progress_at - job.progress_base), len(job.progress))
        del job.progress[:cut]
        job.progress_base += cut
        cut = min(max(0, log_at - job.log_base), len(job.log))
        del job.log[:cut]
        job.log_base += cut

    @staticmethod
    def _expired_or_fail(status: int, detail: str, job: _Job) -> None:
        if status == 404:
            raise Refused(Code.UNREACHABLE, f"queue job {job.handle.job_id} is no longer known to the platform "
                          f"(its TTL passed, or the endpoint went): {detail}")
        if status >= 300:
            raise Unreachable(f"runpod queue: {status} {detail}")

    def _take(self, job: _Job, out: Any) -> None:
        chunks = out if isinstance(out, list) else [out]
        for c in chunks:
            if not isinstance(c, dict):
                continue
            if isinstance(c.get("progress"), str):
                job.progress += c["progress"].encode()
            if isinstance(c.get("log"), str):
                job.log += c["log"].encode()
            if isinstance(c.get("exit_code"), int):
                job.exit_code, job.out = c["exit_code"], c.get("out")

    async def _judge_queue(self, job: _Job) -> None:
        answer = await self.api.queue("GET", job.handle.endpoint_id, "health")
        if answer.status >= 300 or not isinstance(answer.body, dict):
            return  # the queue grace still bounds the wait
        workers = answer.body.get("workers") or {}

        def n(key: str) -> int:
            v = workers.get(key, 0)
            return v if isinstance(v, int) else 0

        now, g = trio.current_time(), self.graces
        if job.submitted is None:
            job.submitted = now
        running = n("running") + n("ready") + n("idle") + n("initializing")
        job.throttled_since = (job.throttled_since or now) if n("throttled") and not running else None
        job.unhealthy_since = (job.unhealthy_since or now) if n("unhealthy") and not running else None
        if job.unhealthy_since is not None and now - job.unhealthy_since > g.unhealthy_grace_s:
            raise Refused(Code.LAUNCH_FAILED, f"the endpoint's workers stayed unhealthy for "
                          f"{now - job.unhealthy_since:.0f} s (grace {g.unhealthy_grace_s:.0f} s)")
        if job.throttled_since is not None and now - job.throttled_since > g.throttled_grace_s:
            raise Refused(Code.NO_CAPACITY, f"the endpoint's workers stayed throttled for "
                          f"{now - job.throttled_since:.0f} s (grace {g.throttled_grace_s:.0f} s): no capacity")
        if n("running") == 0 and now - job.submitted > g.queue_grace_s:
            raise Refused(Code.NO_CAPACITY, f"the job stayed in the queue with no worker running for "
                          f"{now - job.submitted:.0f} s (grace {g.queue_grace_s:.0f} s): no capacity")

    async def _terminal(self, job: _Job) -> None:
        """The job ended: its status once, for what the stream did not carry (the output, an error,
        the execution time)."""
        answer = await self.api.queue("GET", job.handle.endpoint_id, f"status/{job.handle.job_id}")
        self._expired_or_fail(answer.status, answer.detail(), job)
        body = answer.body if isinstance(answer.body, dict) else {}
        job.terminal_checked = True
        ms = body.get("executionTime")
        if isinstance(ms, int | float) and math.isfinite(ms):
            job.executed_s = ms / 1000.0
        if job.exit_code is None:
            self._take(job, body.get("output"))
        status = job.status
        if status in ("CANCELLED", "TIMED_OUT"):
            raise MachineGone(f"the platform ended queue job {job.handle.job_id}: {status}")
        if job.exit_code is None:
            marker, text = worker_error(str(body.get("error") or "no exit code in its output"))
            if marker == INPUT_ERROR:  # the worker could not have the archive as sent
                raise Refused(Code.INPUT, f"queue job {job.handle.job_id}: {text[:500]}")
            if marker == TRANSFER_ERROR:
                raise Refused(Code.TRANSFER_FAILED, f"queue job {job.handle.job_id}: {text[:500]}")
            if marker == PREEMPTED_ERROR:
                raise MachineGone(f"queue job {job.handle.job_id}: {text[:500]}")
            raise Refused(Code.JOB_FAILED, f"queue job {job.handle.job_id} {status}: {text[:500]}")

    def executed_s(self, work: str) -> float:
        """The worker's execution time of the job, as the platform reported it at its end (-1: unknown)."""
        job = self.jobs.get(work)
        return job.executed_s if job is not None else -1.0

    async def beat(self, work: str) -> None:
        return None  # the platform's executionTimeout is the job's watchdog

    async def wait_exit(self, work: str, pid: int) -> None:
        await trio.sleep_forever()  # the polls see the end

    def exit_at(self, work: str, pid: int) -> float | None:
        return math.inf  # no hint: nothing need wait for one

    async def stop(self, work: str) -> None:
        job = self.jobs.get(work)
        if job is not None and job.status not in TERMINAL:
            await self.api.queue("POST", job.handle.endpoint_id, f"cancel/{job.handle.job_id}")
            job.status = "CANCELLED"

    async def fetch(self, work: str, local_dir: Path, names: list[str] | None = None) -> int:
        """out/ and progress.jsonl from the job's last chunk; a checkpoint cannot be fetched mid-run."""
        job = self._job(work)
        if names is not None:
            raise Unreachable("a serverless job's files come back only at its end")
        if job.out is None:
            return 0
        try:
            data = await self._out(job, job.out)
        except PayloadError as exc:
            raise Refused(Code.INTERNAL, f"queue job {job.handle.job_id}: {exc}") from exc
        await to_thread(_extract_out, data, local_dir)
        return len(data)

    async def _out(self, job: _Job, out: dict[str, Any]) -> bytes:
        """The out/ archive of the job's last chunk: inline, or put by the worker in the store."""
        if not out.get("put"):
            return decode_blob(out)
        if self.store is None or not job.handle.out_key:
            raise Refused(Code.TRANSFER_FAILED, f"queue job {job.handle.job_id} put its out/ in an object store "
                          "this controller was not given")
        data = await self.store.get(job.handle.out_key)
        if len(data) != out.get("size") or sha256(data) != out.get("sha256"):
            raise Refused(Code.TRANSFER_FAILED, f"queue job {job.handle.job_id}: {job.handle.out_key} holds "
                          f"{len(data)} bytes of sha256 {sha256(data)}, not {out.get('size')} of {out.get('sha256')}")
        return data

    async def remove(self, work: str) -> None:
        self.jobs.pop(work, None)

    async def last_beat(self) -> HostBeat | None:
        return None  # no host of ours to stamp: an endpoint is proven abandoned by its owner or deadline

    async def aclose(self) -> None:
        """Before the endpoint is deleted: cancel what is still out (the delete would, but a cancel
        is the queue's own word for it)."""
        for work in list(self.jobs):
            await self.stop(work)


def _extract_out(data: bytes, local_dir: Path) -> None:
    local_dir.mkdir(parents=True, exist_ok=True)
    unpack(data, local_dir)

