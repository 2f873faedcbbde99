"""A fake RunPod serverless on loopback: the REST v2 endpoint management API (on FakeRunPod, so every
request and response is held to RunPod's own OpenAPI document) and the queue API
(`/v2/{endpoint}/run|status|stream|cancel|health`, contract §11, which no OpenAPI document covers:
its shapes are checked here against the contract's table).

Its workers are real: a queued job is taken by a free worker of its endpoint, which runs actor-run's
own handler (`python -m actor_run.protocols.serverless --once`) in a subprocess on this machine; the
handler's chunks become the job's stream, its end the job's status.

Faults, set on the instance (under `fake.lock`):
    throttled = {pool}            workers of endpoints on these pools are THROTTLED: jobs stay queued
    unhealthy = {pool}            ... UNHEALTHY: jobs stay queued
    quota_workers = n             creates past n workersMax in all answer 400 "max workers across all endpoints"
    delete_500_done = n           the next n endpoint deletes delete, then answer 500
    queue_rate_limit(n, s)        the next n queue requests answer 429 with Retry-After s
`expire(job_id)` forgets a job (its TTL passed: 404); `platform_cancel(job_id)` cancels it as the
platform would (CANCELLED); `held` = True keeps new jobs queued (no worker takes one) until False.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
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

POOLS = {  # GPU type id -> (pool, serverless USD per GPU-hour)
    "NVIDIA A100-SXM4-80GB": ("AMPERE_80", 2.72),
    "NVIDIA H100 80GB HBM3": ("HOPPER_141", 4.18),
    "NVIDIA GeForce RTX 4090": ("ADA_24", 1.10),
}
GPU_NAMES = {"NVIDIA A100-SXM4-80GB": ("A100 SXM", 80), "NVIDIA H100 80GB HBM3": ("H100 SXM", 80),
             "NVIDIA GeForce RTX 4090": ("RTX 4090", 24)}
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
        self.proc: subprocess.Popen[str] | None = None
        self.started = self.ended = 0.0


class FakeRunPodServerless(FakeRunPod):
    def __init__(self, dir: Path, *, token: str = "test-key") -> None:
        super().__init__(dir, token=token, virtual=True)
        self.endpoints: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, Job] = {}
        self.throttled: set[str] = set()
        self.unhealthy: set[str] = set()
        self.quota_workers = 1000
        self.delete_500_done = 0
        self.held = False
        self.queue_calls: list[tuple[str, str, int]] = []
        self.queue_violations: list[str] = []
        self.submitted: list[str] = []  # job ids in the order /run made them
        self.executed: dict[str, float] = {}  # job id -> seconds a worker ran it
        self._queue_limited: list[float] = []
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
                        "allowedCudaVersions": [], "minCudaVersion": None},
                "workers": {"min": body["workers"].get("min", 0), "max": want,
                            "idleTimeout": body["workers"].get("idleTimeout", 5)},
                "scaling": body["scaling"], "dataCenterIds": body.get("dataCenterIds", []), "networkVolumes": [],
                "timeout": body.get("timeout", 600000), "flashboot": body.get("flashboot", "OFF"),
                "createdAt": _iso(time.time()),
                "_busy": 0,
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
            for job in self.jobs.values():  # its workers go, and every job still out is cancelled
                if job.endpoint == id and job.status in ("IN_QUEUE", "IN_PROGRESS"):
                    self._end(job, "CANCELLED")
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
        w = {"idle": 0, "initializing": 0, "ready": 0, "running": e["_busy"], "throttled": 0, "unhealthy": 0}
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
            self.queue_calls.append((req.method, template, resp.status_code))
            self.changed.notify_all()
        return resp(environ, start_response)

    def _queue_answer(self, req: Request, parts: list[str]) -> tuple[Response, str]:
        if len(parts) < 3 or parts[0] != "v2":
            return json_response({"error": "not found"}, 404), req.path
        eid, op, rest = parts[1], parts[2], parts[3:]
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
            self._dispatch()
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
            out["workerId"] = f"worker-{job.endpoint}"
        if job.output is not None:
            out["output"] = job.output
        if job.error is not None:
            out["error"] = job.error
        assert out["status"] in QUEUE_STATES
        return out

    # --- workers -------------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Under the lock: give each free worker of a healthy endpoint its next queued job."""
        if self.held:
            return
        for job in list(self.jobs.values()):
            e = self.endpoints.get(job.endpoint)
            if job.status != "IN_QUEUE" or e is None:
                continue
            pool = e["gpu"]["pools"][0]
            if pool in self.throttled or pool in self.unhealthy or e["_busy"] >= e["workers"]["max"]:
                continue
            e["_busy"] += 1
            job.status, job.started = "IN_PROGRESS", time.time()
            env = {k: v for k, v in os.environ.items() if not k.startswith("RUNPOD")}
            job.proc = subprocess.Popen(
                [sys.executable, "-m", "actor_run.protocols.serverless", "--once"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, start_new_session=True)
            threading.Thread(target=self._worker, args=(job, job.proc), daemon=True,
                             name=f"fake-worker-{job.id}").start()

    def _worker(self, job: Job, proc: subprocess.Popen[str]) -> None:
        """A worker thread: the job's JSON to the handler, its lines into the job."""
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"id": job.id, "input": job.body["input"]}))
            proc.stdin.close()
        except OSError:
            pass
        with proc.stdout:
            self._read_worker(job, proc.stdout)
        proc.wait()
        with self.lock:
            if job.status == "IN_PROGRESS":  # the handler died without a word
                job.error = f"worker exited {proc.returncode}"
                self._end(job, "FAILED")
            self.changed.notify_all()

    def _read_worker(self, job: Job, lines: Any) -> None:
        for line in lines:
            msg = json.loads(line)
            with self.lock:
                if job.status != "IN_PROGRESS":
                    break
                if "stream" in msg:
                    job.stream.append(msg["stream"])
                elif "output" in msg:
                    job.output = msg["output"]
                    self._end(job, "COMPLETED")
                elif "error" in msg:
                    job.error = msg["error"]
                    self._end(job, "FAILED")
                self.changed.notify_all()

    def _end(self, job: Job, status: str) -> None:
        """Under the lock."""
        was_running = job.status == "IN_PROGRESS"
        job.status = status
        if was_running:
            job.ended = time.time()
            self.executed[job.id] = job.ended - job.started
            e = self.endpoints.get(job.endpoint)
            if e is not None:
                e["_busy"] -= 1
            if job.proc is not None and job.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.proc.pid, 9)
        self._dispatch()

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
            self._dispatch()

    def live_endpoints(self) -> list[str]:
        with self.lock:
            return sorted(e["name"] for e in self.endpoints.values())

    # --- servers -------------------------------------------------------------------------------------

    def start(self) -> FakeRunPodServerless:
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

