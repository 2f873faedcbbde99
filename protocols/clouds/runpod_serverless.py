"""The `runpod-serverless` cloud: a lease is a RunPod serverless endpoint, the attempt's run is one
job on its queue (rp_queue.py), and the worker image runs actor-run's own handler
(`python -m actor_run.protocols.serverless`).

- `offers`: the GPU class's serverless pool (the offer's `kind`) and per-second price from `GET /v2/catalog/gpus`
  (product SERVERLESS); a class with no pool, no serverless price or availability NONE has no offer.
- `launch`: `POST /v2/serverless` (a QUEUE endpoint, 0..`workers_max` workers, the image inline or
  the user's `template_id`; REST v2 makes the endpoint's own template from an inline image and
  deletes it with the endpoint, so no template of ours outlives it), named by our naming rule, its
  per-job timeout the time left until the deadline. A 4xx proves nothing was made (clean); a 5xx
  or no answer is looked up by name first (found: adopted; not found: ambiguous). A workers-quota
  refusal (contract: "max workers across all endpoints") first deletes our own idle endpoints that
  `reclaim` (the sweep's rules, installed by the Runner) says no live run owns, tries once more,
  then refuses `quota`: the same place on the next account (`[clouds.runpod-serverless.accounts]`),
  else the next candidate.
- `delete`: `DELETE /v2/serverless/{id}` (which also deletes its bound template), then a `GET`
  must answer 404: a 5xx is not taken as an answer either way.
- `list_ours`: `GET /v2/serverless`, ours by name prefix.
- `object_store`: an S3-compatible store (object_store.py) for archives above `inline_limit`: put
  once under their sha256, the worker handed only a presigned GET URL.
The per-second price is kept as the machine's hourly rate; the attempt bills the worker's
execution time the platform reports (capped at the deadline), not the endpoint's lifetime.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import msgspec

from actor_run.protocols.clouds.capabilities import Reclaim, Reclaiming
from actor_run.protocols.clouds.gpus import cuda_floor, cuda_text, gpu_class, gpu_count, shape, vendor_ids
from actor_run.protocols.clouds.http import NotSent
from actor_run.protocols.clouds.object_store import ObjectStore, ObjectStoreSettings
from actor_run.protocols.clouds.rented import api_key
from actor_run.protocols.clouds.rp_api import Answer, RunPodApi
from actor_run.protocols.clouds.rp_queue import Graces, ServerlessWorkspace
from actor_run.protocols.failures import (
    ActorRunError,
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchRefused,
    SpecError,
    Unreachable,
)
from actor_run.protocols.hosts.workspace import Workspace
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.names import PREFIX, parse_name
from actor_run.protocols.serverless import INLINE_LIMIT
from actor_run.protocols.specs import CandidateSpec

VENDOR = "runpod"
QUOTA_TEXT = "max workers across all endpoints"  # seed 002; runpod.md §11: max workers per account

# What a create's refusal means (a 5xx or no answer proves nothing: the name is looked up first).
# (status, words in the body, code, the contract line it comes from)
CREATE_ANSWERS: list[tuple[int, str, Code, str]] = [
    (400, QUOTA_TEXT, Code.QUOTA, "runpod.md §11: max workers per account (our idle endpoints went first)"),
    (400, "", Code.LAUNCH_FAILED, "runpod-rest-v2.json createEndpoint 400 BadRequestError: refused, nothing made"),
    (404, "", Code.LAUNCH_FAILED, "runpod-rest-v2.json createEndpoint 404 NotFoundError (a template or volume)"),
    (422, "", Code.LAUNCH_FAILED, "runpod-rest-v2.json createEndpoint 422 UnprocessableEntityError"),
]


def classify_create(status: int, body: str) -> Code | None:
    """The failure a create's refusal means, or None when it proves nothing (ambiguous)."""
    text = body.lower()
    for want, words, code, _ in CREATE_ANSWERS:
        if status == want and (not words or words in text):
            return code
    return None


class ServerlessSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    image: str = ""  # the worker image (it runs `python -m actor_run.protocols.serverless`)
    template_id: str = ""  # or a serverless template of yours that does
    api_key_env: str = "RUNPOD_API_KEY"
    rest_url: str = "https://api.runpod.io"
    queue_url: str = "https://api.runpod.ai"
    gpu_count: Annotated[int, msgspec.Meta(ge=1)] = 1
    workers_max: Annotated[int, msgspec.Meta(ge=1)] = 1
    idle_timeout_s: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 5  # runpod-rest-v2.json EndpointWorkers
    flashboot: bool = False
    queue_grace_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    throttled_grace_s: Annotated[float, msgspec.Meta(gt=0)] = 300.0
    unhealthy_grace_s: Annotated[float, msgspec.Meta(gt=0)] = 240.0
    stream_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    ttl_s: Annotated[float, msgspec.Meta(ge=10, le=7 * 24 * 3600)] = 24 * 3600.0  # runpod.md §11: 10 s - 7 d
    # an archive above inline_limit goes through this store (a presigned URL in the payload)
    object_store: ObjectStoreSettings | None = None
    inline_limit: Annotated[int, msgspec.Meta(ge=1, le=INLINE_LIMIT)] = INLINE_LIMIT


class ServerlessCloud(Reclaiming):
    name = "runpod-serverless"
    account = ""  # make_cloud sets it for an account of [clouds.runpod-serverless.accounts]

    def __init__(self, settings: ServerlessSettings, state_dir: Path) -> None:
        if not settings.image and not settings.template_id:
            raise SpecError("clouds.runpod-serverless.image", "name the worker image (or a template_id)")
        self.settings = settings
        self.api = RunPodApi(rest_url=settings.rest_url, queue_url=settings.queue_url,
                             key=api_key(self.name, settings.api_key_env))
        self.graces = Graces(queue_grace_s=settings.queue_grace_s, throttled_grace_s=settings.throttled_grace_s,
                             unhealthy_grace_s=settings.unhealthy_grace_s, stream_s=settings.stream_s,
                             ttl_s=settings.ttl_s)
        self.reclaim: Reclaim | None = None  # the Runner's: which of these may go (the sweep's rules)
        # one store for every lease, so an archive shared by attempts is put once
        self.store = (ObjectStore(settings.object_store, "clouds.runpod-serverless.object_store")
                      if settings.object_store is not None else None)

    # --- offers ------------------------------------------------------------------------------------

    async def _catalog(self, gpu: str) -> tuple[str, float] | None:
        """The GPU class's serverless pool and price per GPU-hour, or None when it has none with stock."""
        answer = await self.api.rest("GET", "/v2/catalog/gpus",
                                     params={"include": "AVAILABILITY", "product": "SERVERLESS"})
        if answer.status != 200 or not isinstance(answer.body, dict):
            raise Unreachable(f"runpod catalog: {answer.status} {answer.detail()}")
        catalog = {g.get("id"): g for g in answer.body.get("gpus") or [] if isinstance(g, dict)}
        for type_id in vendor_ids(gpu, VENDOR):
            found = catalog.get(type_id)
            if found is None:
                continue
            price = (found.get("price") or {}).get("serverless")
            if not found.get("pool") or not isinstance(price, int | float) or found.get("availability") == "NONE":
                return None
            return str(found["pool"]), float(price)
        return None

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        found = await self._catalog(candidate.gpu)
        if found is None:
            return []
        count = self._count(candidate.gpu)
        hourly = found[1] * count  # the worker's: the catalog's price is per GPU
        if candidate.max_hourly_usd is not None and hourly > candidate.max_hourly_usd:
            return []
        return [Offer(cloud=self.name, region=",".join(candidate.regions), gpu=shape(gpu_class(candidate.gpu), count),
                      hourly_usd=hourly, candidate=index, kind=found[0], image=candidate.image)]

    def _count(self, gpu: str) -> int:
        """GPUs per worker: a shape's count (`A100:2`), else the settings' `gpu_count`."""
        return gpu_count(gpu) if ":" in gpu else self.settings.gpu_count

    # --- launch ------------------------------------------------------------------------------------

    async def _body(self, offer: Offer, name: str, deadline: float) -> dict[str, Any]:
        s = self.settings
        pool = offer.kind  # the serverless pool the catalog named for the offer
        if not pool:  # an offer made elsewhere: ask the catalog
            found = await self._catalog(offer.gpu)
            if found is None:
                raise LaunchRefused(f"runpod-serverless: {offer.gpu} has no serverless pool with stock",
                                    Code.NO_CAPACITY)
            pool = found[0]
        body: dict[str, Any] = {
            "name": name, "type": "QUEUE",
            "gpu": {"pools": [pool], "count": self._count(offer.gpu)},
            "workers": {"min": 0, "max": s.workers_max, "idleTimeout": s.idle_timeout_s},
            "scaling": {"type": "QUEUE_DELAY", "queueDelay": 4},
            "timeout": max(5_000, int((deadline - time.time()) * 1000)),
            "flashboot": "FLASHBOOT" if s.flashboot else "OFF",
        }
        if offer.region:
            body["dataCenterIds"] = offer.region.split(",")
        floor = cuda_floor(offer.gpu)
        if floor is not None:  # workers only on hosts whose CUDA runs this GPU class (seed 002)
            body["gpu"]["minCudaVersion"] = cuda_text(floor)
        if s.template_id and not offer.image:
            body["templateId"] = s.template_id
        else:
            body["image"] = offer.image or s.image
        return body

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        body = await self._body(offer, name, deadline)
        answer = await self._create(body, name)
        if isinstance(answer, Machine):
            return self._machine(answer, offer, deadline)
        swept = -1
        if QUOTA_TEXT in answer.detail().lower():  # free what our dead runs hold, then once more
            swept = await self._reclaim_idle()
            answer = await self._create(body, name)
            if isinstance(answer, Machine):
                return self._machine(answer, offer, deadline)
        code = classify_create(answer.status, answer.detail())
        if code is None:
            raise LaunchAmbiguous(f"runpod-serverless: create answered {answer.status}: {answer.detail()}")
        also = f" (after reclaiming {swept} idle endpoint(s) of ours)" if swept >= 0 else ""
        raise LaunchRefused(f"runpod-serverless: create refused{also}: {answer.status} {answer.detail()}", code)

    async def _create(self, body: dict[str, Any], name: str) -> Machine | Answer:
        """The endpoint made (as a Machine without price and deadline), or the clean refusal."""
        try:
            answer = await self.api.rest("POST", "/v2/serverless", body)
        except Unreachable as exc:
            if isinstance(exc.__cause__, NotSent):  # it never left: nothing was made
                raise LaunchRefused(f"runpod-serverless: {exc}", Code.LAUNCH_FAILED) from exc
            found = await self._find(name)
            if found is not None:
                return found
            raise LaunchAmbiguous(f"runpod-serverless: no answer to the create: {exc}") from exc
        if answer.status in (200, 201) and isinstance(answer.body, dict) and answer.body.get("id"):
            return _as_machine(answer.body, self.account)
        if answer.status >= 500:
            found = await self._find(name)
            if found is not None:
                return found
            raise LaunchAmbiguous(f"runpod-serverless: create answered {answer.status}: {answer.detail()}")
        return answer

    def _machine(self, made: Machine, offer: Offer, deadline: float) -> Machine:
        return msgspec.structs.replace(made, region=offer.region, gpu=offer.gpu, hourly_usd=offer.hourly_usd,
                                       deadline=deadline, created_at=time.time())

    async def _find(self, name: str) -> Machine | None:
        try:
            for m in await self.list_ours(name):
                if m.name == name:
                    return m
        except (ActorRunError, OSError):
            return None
        return None

    async def _reclaim_idle(self) -> int:
        """Delete our idle endpoints that no live run owns (the Runner's sweep rules decide who)."""
        if self.reclaim is None:
            return 0
        idle = []
        for m in await self.list_ours(PREFIX):
            answer = await self.api.queue("GET", m.id, "health")
            if answer.status != 200 or not isinstance(answer.body, dict):
                continue
            jobs, workers = answer.body.get("jobs") or {}, answer.body.get("workers") or {}
            if not jobs.get("inQueue") and not jobs.get("inProgress") and not workers.get("running"):
                idle.append(m)
        doomed = await self.reclaim(idle) if idle else []
        gone = 0
        for m in doomed:
            try:
                await self.delete(m.name, m.id)
                gone += 1
            except (DeleteUnconfirmed, ActorRunError):
                continue
        return gone

    async def connect(self, machine: Machine) -> Workspace:
        return ServerlessWorkspace(self.api, machine.id, self.graces, machine.deadline, store=self.store,
                                   inline_limit=self.settings.inline_limit)

    # --- delete and list ---------------------------------------------------------------------------

    async def delete(self, name: str, machine_id: str = "") -> None:
        if not machine_id:
            found = await self._find(name)
            if found is None:
                return  # never made, or gone
            machine_id = found.id
        answer = await self.api.rest("DELETE", f"/v2/serverless/{machine_id}")
        if answer.status not in (204, 404) and answer.status < 500:
            raise DeleteUnconfirmed(f"runpod-serverless: delete {machine_id}: {answer.status} {answer.detail()}")
        # proven by a read, whatever the delete answered (a 500 may have deleted it)
        check = await self.api.rest("GET", f"/v2/serverless/{machine_id}")
        if check.status != 404:
            raise DeleteUnconfirmed(f"runpod-serverless: endpoint {machine_id} still there after delete "
                                    f"({answer.status}, then {check.status})")

    async def list_ours(self, prefix: str) -> list[Machine]:
        answer = await self.api.rest("GET", "/v2/serverless")
        if answer.status != 200 or not isinstance(answer.body, dict):
            raise Unreachable(f"runpod-serverless: list: {answer.status} {answer.detail()}")
        return [_as_machine(e, self.account) for e in answer.body.get("endpoints") or []
                if isinstance(e, dict) and str(e.get("name", "")).startswith(prefix)]

    async def aclose(self) -> None:
        await self.api.aclose()


def _as_machine(e: dict[str, Any], account: str = "") -> Machine:
    name = str(e.get("name", ""))
    parsed = parse_name(name)
    return Machine(cloud=ServerlessCloud.name, id=str(e["id"]), name=name,
                   deadline=float(parsed.deadline) if parsed else 0.0,
                   region=",".join(e.get("dataCenterIds") or []), address=f"endpoint:{e['id']}", account=account)

