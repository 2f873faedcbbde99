"""A fake RunPod serverless on loopback: the REST v2 endpoint management API (on FakeRunPod, so every
request and response is held to RunPod's own OpenAPI document) and the queue API
(`/v2/{endpoint}/run|status|stream|cancel|health`, contract §11, which no OpenAPI document covers:
its shapes are checked here against the contract's table).

Its workers are real, and run RunPod's own SDK: a queued job brings up a worker process for its
endpoint (up to `workers.max`), running the image's command (`worker_argv`: actor-run's handler,
`python -m actor_run.protocols.serverless`, under `runpod.serverless.start`) with the environment
RunPod gives a worker (RUNPOD_WEBHOOK_GET_JOB, _POST_OUTPUT, _POST_STREAM, _PING, RUNPOD_POD_ID,
RUNPOD_AI_API_KEY). Each is forked, with that environment, from a process of this test process's
that has imported the SDK and the handler already (fakes/zygote.py: the imports that read the
environment are done again in the worker), not started as a fresh interpreter (`warm` = False does
that, as does a `worker_argv` that is neither this command nor a `python -c ...`). The fake serves
the platform's side of the SDK's calls: the job-take long poll (`{"id", "input"}`, or 204), the
job-stop long poll (`{"jobsToStop": [...]}`: how a `/cancel` or a timeout reaches the worker), the
stream posts (each chunk held to the 1 MB limit) and the done post (`{"output": [...]}` or
`{"error": ...}`), and pings. A deleted endpoint's workers get SIGTERM, then SIGKILL after a grace,
as a stopped container does.

Faults, set on the instance (under `fake.lock`):
    throttled = {pool}            workers of endpoints on these pools are THROTTLED: jobs stay queued
    unhealthy = {pool}            ... UNHEALTHY: jobs stay queued
    quota_workers = n             creates past n workersMax in all answer 400 "max workers across all endpoints"
    delete_500_done = n           the next n endpoint deletes delete, then answer 500
    queue_rate_limit(n, s)        the next n queue requests answer 429 with Retry-After s
`expire(job_id)` forgets a job (its TTL passed: 404); `platform_cancel(job_id)` cancels it as the
platform would (CANCELLED); `held` = True keeps new jobs queued (no worker takes one) until False;
`terminate_workers()` stops workers as a stopped container is (SIGTERM, SIGKILL after a grace);
`worker_argv` is the image's command (another handler, e.g. an older image's). What reached the
workers is kept: `stop_delivered` (when a job's stop first went out), `chunk_sizes` (each stream
post), `worker_calls`. An idle worker is stopped past its endpoint's `idleTimeout`.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from fakes.openapi_server import json_response
from fakes.runpod import FakeRunPod, problem
from fakes.zygote import ForkedProcess, zygote

POOLS = {  # GPU type id -> (pool, serverless USD per GPU-hour)
    "NVIDIA A100-SXM4-80GB": ("AMPERE_80", 2.72),
    "NVIDIA H100 80GB HBM3": ("HOPPER_141", 4.18),
    "NVIDIA GeForce RTX 4090": ("ADA_24", 1.10),
}
GPU_NAMES = {"NVIDIA A100-SXM4-80GB": ("A100 SXM", 80), "NVIDIA H100 80GB HBM3": ("H100 SXM", 80),
             "NVIDIA GeForce RTX 4090": ("RTX 4090", 24)}
WORKER_OPS = {"job-take", "job-stop", "job-stream", "job-done", "ping"}  # what RunPod's SDK calls
STREAM_CHUNK_LIMIT = 1000 * 1000  # runpod.md §11: a stream chunk is at most 1 MB
QUEUE_STATES = {"IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"}


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Job:
    def __init__(self, job_id: str, endpoint: str, body: dict[str, Any]) -> None:
        self.id, self.endpoint, self.body = job_id, endpoint, body
        self.status = "IN_QUEUE"
        self.stream: list[Any] = []  # chunks not yet read through /stream
        self.output: Any = None
        self.error: str | None = None
        self.worker = ""  # the worker that took it
        self.started = self.ended = 0.0


class Worker:
    """One serverless worker: a process running the worker image's command (RunPod's SDK loop)."""

    def __init__(self, wid: str, endpoint: str, proc: subprocess.Popen[bytes] | ForkedProcess) -> None:
        self.id, self.endpoint, self.proc = wid, endpoint, proc
        self.alive = True  # False once the platform stopped it
        self.polled = False  # it has asked for a job (past its start-up)
        self.job: Job | None = None
        self.idle_since = time.monotonic()
        self.stops: dict[str, float] = {}  # job id to stop -> time.monotonic() it was last told (0: not yet)


class FakeRunPodServerless(FakeRunPod):
    def __init__(self, dir: Path, *, token: str = "test-key") -> None:
        super().__init__(dir, token=token, virtual=True)
        self.dir = Path(dir)  # the workers' logs (worker-<id>.log) and working folder
        self.dir.mkdir(parents=True, exist_ok=True)
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, Job] = {}
        self.throttled: set[str] = set()
        self.unhealthy: set[str] = set()
        self.quota_workers = 1000
        self.delete_500_done = 0
        self.held = False
        self.queue_calls: list[tuple[str, str, int]] = []  # the queue API's users' calls (run, stream, ...)
        self.worker_calls: list[tuple[str, str, int]] = []  # the workers' (job-take, job-stream, ...)
        self.queue_violations: list[str] = []
        self.submitted: list[str] = []  # job ids in the order /run made them
        self.executed: dict[str, float] = {}  # job id -> seconds a worker ran it
        self._queue_limited: list[float] = []
        self.workers: dict[str, Worker] = {}
        self.worker_key = "worker-own-key"  # RUNPOD_AI_API_KEY in a worker: not the account's key
        self.worker_argv = [sys.executable, "-m", "actor_run.protocols.serverless"]  # the image's CMD
        self.warm = True  # workers forked from the zygote where they can be (False: a fresh interpreter each)
        self.zygote = zygote()  # this test process's
        self.take_wait_s = 2.0  # how long a job-take or job-stop long poll is held open
        self.stop_delivered: dict[str, float] = {}  # job id -> time.monotonic() its stop reached the worker
        self.chunk_sizes: list[int] = []  # bytes of each stream post
        self._stoppers: list[threading.Thread] = []
        self._wids = itertools.count(1)
        self._eids = itertools.count(1)
        self._jids = itertools.count(1)
        self._queue_server: Any = None
        self._queue_thread: threading.Thread | None = None
        self.queue_url = ""
        self._serverless_routes()

    # --- REST v2: catalog and endpoints --------------------------------------------------------------

    def _endpoint_view(self, e: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in e.items() if not k.startswith("_")}

    def _serverless_routes(self) -> None:
        mine_first = len(self.routes)

        @self.route("GET", "/v2/catalog/gpus")
        def catalog(req: Request) -> Response:
            gpus = []
            for gpu_id, (pool, price) in POOLS.items():
                name, memory = GPU_NAMES[gpu_id]
                gpus.append({
                    "id": gpu_id, "name": name, "pool": pool, "manufacturer": "NVIDIA", "memory": memory,
                    "secure": True, "community": True, "price": {"secure": 2.0, "community": 1.5, "serverless": price},
                    "maxCount": {"secure": 8, "community": 8},
                    "availability": "HIGH",
                })
            return json_response({"gpus": gpus})

        # the catalog above answers before FakeRunPod's (which has no serverless pools)
        self.routes.insert(0, self.routes.pop(mine_first))

        @self.route("POST", "/v2/serverless")
        def create(req: Request) -> Response:
            body = req.get_json()
            want = int(body.get("workers", {}).get("max", 0))
            used = sum(int(e["workers"]["max"]) for e in self.endpoints.values())
            if used + want > self.quota_workers:
                return problem(400, "Bad Request", f"Max workers across all endpoints must not exceed your "
                               f"workers quota ({self.quota_workers})")
            n = next(self._eids)
            eid = f"ep{n:04d}q"
            e = {
                "id": eid, "name": body["name"], "type": body["type"], "image": body.get("image", ""), "args": "",
                "disk": 20, "ports": [], "env": {}, "registry": None,
                "gpu": {"pools": body["gpu"]["pools"], "count": body["gpu"].get("count", 1),
                        "allowedCudaVersions": body["gpu"].get("allowedCudaVersions", []),
                        "minCudaVersion": body["gpu"].get("minCudaVersion")},
                "workers": {"min": body["workers"].get("min", 0), "max": want,
                            "idleTimeout": body["workers"].get("idleTimeout", 5)},
                "scaling": body["scaling"], "dataCenterIds": body.get("dataCenterIds", []), "networkVolumes": [],
                "timeout": body.get("timeout", 600000), "flashboot": body.get("flashboot", "OFF"),
                "createdAt": _iso(time.time()),
            }
            self.endpoints[eid] = e
            return json_response(self._endpoint_view(e), 201)

        @self.route("GET", "/v2/serverless")
        def listing(req: Request) -> Response:
            return json_response({"endpoints": [self._endpoint_view(e) for e in self.endpoints.values()]})

        @self.route("GET", "/v2/serverless/{id}")
        def read(req: Request, id: str) -> Response:
            e = self.endpoints.get(id)
            if e is None:
                return problem(404, "Not Found", "endpoint not found")
            return json_response(self._endpoint_view(e))

        @self.route("DELETE", "/v2/serverless/{id}")
        def delete(req: Request, id: str) -> Response:
            if id not in self.endpoints:
                return problem(404, "Not Found", "endpoint not found")
            del self.endpoints[id]
            for job in self.jobs.values():  # every job still out is cancelled, and its workers go
                if job.endpoint == id and job.status in ("IN_QUEUE", "IN_PROGRESS"):
                    self._end(job, "CANCELLED")
            for w in self.workers.values():
                if w.endpoint == id and w.alive:
                    t = threading.Thread(target=self.terminate_workers, args=(id,), daemon=True,
                                         name=f"fake-stop-{id}")
                    self._stoppers.append(t)
                    t.start()
                    break
            if self.delete_500_done > 0:  # runpod.md §3: the delete worked, the answer says otherwise
                self.delete_500_done -= 1
                return problem(500, "Internal Server Error", "delete endpoint: upstream error")
            return Response(status=204)

    # --- the queue API -------------------------------------------------------------------------------

    def queue_rate_limit(self, times: int, retry_after: float = 1.0) -> None:
        with self.lock:
            self._queue_limited.extend([retry_after] * times)

    def _workers(self, e: dict[str, Any]) -> dict[str, int]:
        pool = e["gpu"]["pools"][0]
        queued = sum(1 for j in self.jobs.values() if j.endpoint == e["id"] and j.status == "IN_QUEUE")
        mine = [w for w in self.workers.values() if w.endpoint == e["id"] and w.alive]
        w = {"idle": sum(1 for x in mine if x.polled and x.job is None),
             "initializing": sum(1 for x in mine if not x.polled), "ready": 0,
             "running": sum(1 for x in mine if x.job is not None), "throttled": 0, "unhealthy": 0}
        if queued and pool in self.throttled:
            w["throttled"] = e["workers"]["max"]
        elif queued and pool in self.unhealthy:
            w["unhealthy"] = e["workers"]["max"]
        return w

    def _queue_app(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = Request(environ)
        parts = req.path.strip("/").split("/")
        with self.lock:
            resp, template = self._queue_answer(req, parts)
            worker = len(parts) > 2 and parts[2] in WORKER_OPS  # the SDK's calls, not the user's
            (self.worker_calls if worker else self.queue_calls).append((req.method, template, resp.status_code))
            self.changed.notify_all()
        return resp(environ, start_response)

    def _queue_answer(self, req: Request, parts: list[str]) -> tuple[Response, str]:
        if len(parts) < 3 or parts[0] != "v2":
            return json_response({"error": "not found"}, 404), req.path
        eid, op, rest = parts[1], parts[2], parts[3:]
        if op in WORKER_OPS:
            return self._worker_answer(req, eid, op, rest), f"/v2/{{endpoint}}/{op}" + "/{id}" * len(rest)
        template = f"/v2/{{endpoint}}/{op}" + ("/{job}" if rest else "")
        if self._queue_limited:
            wait = self._queue_limited.pop(0)
            return json_response({"error": "rate limited"}, 429, headers={"Retry-After": f"{wait:g}"}), template
        # §11: the raw key or a Bearer key are both accepted
        if req.headers.get("Authorization", "") not in (self.token, f"Bearer {self.token}"):
            return json_response({"error": "Unauthorized"}, 401), template
        e = self.endpoints.get(eid)
        if e is None:
            return json_response({"error": "endpoint not found"}, 404), template
        if op == "run" and req.method == "POST" and not rest:
            body = req.get_json(silent=True)
            if not isinstance(body, dict) or not isinstance(body.get("input"), dict):
                self.queue_violations.append(f"/run without an input object: {str(body)[:200]}")
                return json_response({"error": "input is required"}, 400), template
            extra = set(body) - {"input", "webhook", "policy", "s3Config"}
            if extra:
                self.queue_violations.append(f"/run with unknown keys {sorted(extra)}")
            job = Job(f"job-{next(self._jids):05d}-u1", eid, body)
            self.jobs[job.id] = job
            self.submitted.append(job.id)
            self._scale()
            return json_response({"id": job.id, "status": "IN_QUEUE"}), template
        if op == "health" and req.method == "GET" and not rest:
            jobs = [j for j in self.jobs.values() if j.endpoint == eid]

            def n(s: str) -> int:
                return sum(1 for j in jobs if j.status == s)

            return json_response({"jobs": {"completed": n("COMPLETED"), "failed": n("FAILED"),
                                           "inProgress": n("IN_PROGRESS"), "inQueue": n("IN_QUEUE"), "retried": 0},
                                  "workers": self._workers(e)}), template
        if len(rest) != 1:
            return json_response({"error": "not found"}, 404), template
        job = self.jobs.get(rest[0])
        if job is None or job.endpoint != eid:
            return json_response({"error": "job not found"}, 404), template
        if op == "status" and req.method == "GET":
            return json_response(self._status(job)), template
        if op == "stream" and req.method == "GET":
            chunks, job.stream = job.stream, []
            return json_response({"status": job.status, "stream": [{"output": c} for c in chunks]}), template
        if op == "cancel" and req.method == "POST":
            if job.status in ("IN_QUEUE", "IN_PROGRESS"):
                self._end(job, "CANCELLED")
            return json_response({"id": job.id, "status": job.status}), template
        return json_response({"error": "not found"}, 404), template

    def _status(self, job: Job) -> dict[str, Any]:
        out: dict[str, Any] = {"id": job.id, "status": job.status, "delayTime": 0}
        if job.started:
            out["executionTime"] = int(((job.ended or time.time()) - job.started) * 1000)
            out["workerId"] = job.worker
        if job.output is not None:
            out["output"] = job.output
        if job.error is not None:
            out["error"] = job.error
        assert out["status"] in QUEUE_STATES
        return out

    # --- workers: RunPod's own SDK worker loop, in a process each ------------------------------------

    def _scale(self) -> None:
        """Under the lock: start a worker for each queued job no live worker of its endpoint is free
        to take, up to the endpoint's `workers.max` (workers of a throttled or unhealthy pool never
        come up; a `held` fake starts none)."""
        if self.held:
            return
        for e in list(self.endpoints.values()):
            pool = e["gpu"]["pools"][0]
            if pool in self.throttled or pool in self.unhealthy:
                continue
            queued = sum(1 for j in self.jobs.values() if j.endpoint == e["id"] and j.status == "IN_QUEUE")
            mine = [w for w in self.workers.values() if w.endpoint == e["id"] and w.alive]
            free = sum(1 for w in mine if w.job is None)
            for _ in range(min(queued - free, e["workers"]["max"] - len(mine))):
                self._start_worker(e)

    def _start_worker(self, e: dict[str, Any]) -> None:
        wid = f"{e['id']}-w{next(self._wids)}"
        base, gpu = f"{self.queue_url}/v2/{e['id']}", e["gpu"]["pools"][0]
        # the test process's environment (its PATH, its Python) but no RUNPOD_* of its own, and not the
        # account's key (a test holds it in the variable its settings name): RunPod gives a worker none
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD") and v != self.token}
        env.update({  # what RunPod sets in a serverless worker's container
            "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID?gpu={gpu}",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID?gpu={gpu}",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{base}/job-stream/$RUNPOD_POD_ID/$ID?gpu={gpu}",
            "RUNPOD_WEBHOOK_PING": f"{base}/ping/$RUNPOD_POD_ID?gpu={gpu}",
            "RUNPOD_PING_INTERVAL": "2000", "RUNPOD_POD_ID": wid, "RUNPOD_POD_HOSTNAME": wid,
            "RUNPOD_ENDPOINT_ID": e["id"], "RUNPOD_AI_API_KEY": self.worker_key,
            # this machine has no GPU and is shared: the SDK's start-up fitness checks are not the test
            "RUNPOD_SKIP_GPU_CHECK": "true", "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
            # the SDK prefers ~/.runpod/config.toml's key to RUNPOD_AI_API_KEY: a developer's own stays out
            "HOME": str(self.dir),
        })
        with open(self.dir / f"worker-{wid}.log", "ab") as out:
            # forked from a process that has imported the SDK already (fakes/zygote.py), or, for another
            # command or an environment that process's imports would not match, a fresh interpreter
            proc: subprocess.Popen[bytes] | ForkedProcess | None = None
            if self.warm:
                proc = self.zygote.spawn(self.worker_argv, env, str(self.dir), out.fileno())
            if proc is None:
                proc = subprocess.Popen(self.worker_argv, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=self.dir)
        self.workers[wid] = Worker(wid, e["id"], proc)

    def _worker_of(self, req: Request, eid: str, wid: str) -> Worker | None:
        w = self.workers.get(wid)
        if req.headers.get("Authorization", "") != self.worker_key or w is None or w.endpoint != eid:
            return None
        return w

    def _worker_answer(self, req: Request, eid: str, op: str, rest: list[str]) -> Response:
        """Under the lock: the platform's side of RunPod's SDK (rp_job.py, rp_http.py, rp_ping.py)."""
        w = self._worker_of(req, eid, rest[0]) if rest else None
        if w is None:
            self.queue_violations.append(f"{req.method} {op} from an unknown worker or without its key: {req.path}")
            return json_response({"error": "Unauthorized"}, 401)
        if op == "job-take" and req.method == "GET":
            w.polled = True
            if req.args.get("job_in_progress") == "0" and w.job is not None:
                w.job, w.idle_since = None, time.monotonic()  # nothing in flight: whatever it had is over
            found = self.changed.wait_for(lambda: self._next_for(w), timeout=self.take_wait_s)
            if not found or w.job is not None:
                e = self.endpoints.get(eid)
                if w.job is None and e is not None and time.monotonic() - w.idle_since > e["workers"]["idleTimeout"]:
                    w.alive = False  # idle past the endpoint's idleTimeout: scaled down, as RunPod does
                    t = threading.Thread(target=self.terminate_workers, kwargs={"only": w.id}, daemon=True,
                                         name=f"fake-idle-{w.id}")
                    self._stoppers.append(t)
                    t.start()
                return Response(status=204)
            job: Job = found
            job.status, job.started, job.worker, w.job = "IN_PROGRESS", time.time(), w.id, job
            return json_response({"id": job.id, "input": job.body["input"]})
        if op == "job-stop" and req.method == "GET":
            ids = self._stops_due(w)
            if not ids:
                return Response(status=204)
            now = time.monotonic()
            for job_id in ids:
                self.stop_delivered.setdefault(job_id, now)
                w.stops[job_id] = now
            return json_response({"jobsToStop": ids})
        if op == "ping" and req.method == "GET":
            return json_response({})
        if op in ("job-stream", "job-done") and req.method == "POST" and len(rest) == 2:
            job = self.jobs.get(rest[1])
            body = req.get_data()
            try:
                data = json.loads(body)
            except ValueError:
                self.queue_violations.append(f"{op} with a body that is not JSON: {body[:200]!r}")
                return json_response({"error": "bad body"}, 400)
            if op == "job-stream":
                self.chunk_sizes.append(len(body))
                if len(body) > STREAM_CHUNK_LIMIT:  # runpod.md §11: chunks of at most 1 MB
                    self.queue_violations.append(f"a stream chunk of {len(body)} bytes for {rest[1]}")
                if job is not None and job.status == "IN_PROGRESS" and isinstance(data, dict):
                    job.stream.append(data.get("output"))
            elif job is not None and job.status == "IN_PROGRESS" and isinstance(data, dict):
                if data.get("error"):
                    job.error = str(data["error"])
                    self._end(job, "FAILED")
                else:
                    job.output = data.get("output")
                    self._end(job, "COMPLETED")
            if job is not None and w.job is job and job.status != "IN_PROGRESS" and op == "job-done":
                w.job, w.idle_since = None, time.monotonic()
            return json_response({})
        self.queue_violations.append(f"{req.method} {req.path}: not a worker call RunPod serves")
        return json_response({"error": "not found"}, 404)

    def _stops_due(self, w: Worker) -> list[str]:
        """Under the lock: hold the stop poll open until a job of this worker is to stop. A stop is
        sent again each second while the worker still holds the job (the SDK drops a stop that
        comes before the job's task exists; the platform knows from the worker's pings and takes
        that the job still runs)."""
        deadline = time.monotonic() + self.take_wait_s
        while True:
            if w.job is None or w.job.id not in w.stops:
                w.stops = {}  # nothing held any more: nothing to stop
            now = time.monotonic()
            due = [j for j, sent in w.stops.items() if now - sent >= 1.0]
            if due or now >= deadline:
                return due
            self.changed.wait(timeout=min(0.2, deadline - now))

    def _next_for(self, w: Worker) -> Job | None:
        if self.held or w.job is not None or not w.alive:
            return None
        e = self.endpoints.get(w.endpoint)
        if e is None or e["gpu"]["pools"][0] in self.throttled | self.unhealthy:
            return None
        return next((j for j in self.jobs.values() if j.endpoint == w.endpoint and j.status == "IN_QUEUE"), None)

    def _end(self, job: Job, status: str) -> None:
        """Under the lock. A job ended by the platform (cancel, timeout) is signalled to its worker
        through the stop channel, as RunPod does; the worker's process is left to the SDK."""
        was_running = job.status == "IN_PROGRESS"
        job.status = status
        if was_running:
            job.ended = time.time()
            self.executed[job.id] = job.ended - job.started
            w = self.workers.get(job.worker)
            if w is not None and status in ("CANCELLED", "TIMED_OUT"):
                w.stops[job.id] = 0.0  # due at once
        self.changed.notify_all()
        self._scale()

    def terminate_workers(self, endpoint: str | None = None, grace_s: float = 10.0, *, only: str = "") -> None:
        """Stop workers (of an endpoint, or the one named `only`) as the platform stops a container:
        SIGTERM, then SIGKILL of its process group after `grace_s`."""
        with self.lock:
            doomed = [w for w in self.workers.values()
                      if (w.alive or w.id == only) and endpoint in (None, w.endpoint) and only in ("", w.id)]
            for w in doomed:
                w.alive = False
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
        for w in doomed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(grace_s)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            w.proc.wait()

    # --- faults --------------------------------------------------------------------------------------

    def expire(self, job_id: str) -> None:
        with self.lock:
            job = self.jobs.pop(job_id)
            if job.status == "IN_PROGRESS":
                self._end(job, "TIMED_OUT")

    def platform_cancel(self, job_id: str) -> None:
        with self.lock:
            self._end(self.jobs[job_id], "CANCELLED")

    def release(self) -> None:
        """Workers take queued jobs again (after `held`, `throttled` or `unhealthy` are cleared)."""
        with self.lock:
            self.held = False
            self._scale()
            self.changed.notify_all()

    def live_endpoints(self) -> list[str]:
        with self.lock:
            return sorted(e["name"] for e in self.endpoints.values())

    # --- servers -------------------------------------------------------------------------------------

    def start(self) -> FakeRunPodServerless:
        if self.warm:
            self.zygote.start()  # its imports run while the test sets up
        super().start()
        self._queue_server = make_server("127.0.0.1", 0, self._queue_app, threaded=True)
        self.queue_url = f"http://127.0.0.1:{self._queue_server.server_port}"
        self._queue_thread = threading.Thread(target=self._queue_server.serve_forever, name="fake-queue",
                                              daemon=True)
        self._queue_thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.held = True
            for job in self.jobs.values():
                if job.status == "IN_PROGRESS":
                    self._end(job, "CANCELLED")
            stoppers = list(self._stoppers)
        for t in stoppers:
            t.join(timeout=30)
        self.terminate_workers()
        if self._queue_server is not None:
            self._queue_server.shutdown()
            self._queue_server.server_close()
            self._queue_server = None
        if self._queue_thread is not None:
            self._queue_thread.join(timeout=10)
        super().stop()


@contextlib.contextmanager
def serving(folder: Path) -> Iterator[FakeRunPodServerless]:
    """The fake on loopback for one test; when it ends, nothing either side said broke the vendor's
    document or the queue API's."""
    server = FakeRunPodServerless(folder).start()
    try:
        yield server
    finally:
        server.stop()
    assert server.violations == []
    assert server.queue_violations == []


def settings(fake: FakeRunPodServerless, **extra: Any) -> dict[str, Any]:
    """`[clouds.runpod-serverless]` pointed at the fake (its key in RP_TEST_KEY, a quick stream poll)."""
    return {"image": "me/actor-run-worker:1", "rest_url": fake.url, "queue_url": fake.queue_url,
            "api_key_env": "RP_TEST_KEY", "stream_s": 0.05, **extra}

