"""The `runpod` cloud: RunPod GPU pods over REST v2 (`https://api.runpod.io/v2/...`).

Settings (`[clouds.runpod]`), every field optional (and those of clouds/rented.py)::

    api_url = "https://api.runpod.io"
    api_key_env = "RUNPOD_API_KEY"     # the variable that holds the key (never the key itself)
    ssh_key = "~/.ssh/id_ed25519"      # its public half goes to the pod as env PUBLIC_KEY
    root = "~/.actor-run"
    image = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"   # a candidate's `image` wins
    cloud = "SECURE"                   # or COMMUNITY
    disk_gb = 50

Offers come from `GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=<cloud>&count=<n>
&minCudaVersion=<v>`: one per data center whose availability is not NONE, at the GPU type's price
for that cloud times the shape's count (`gpu = "H100:8"`: a pod with eight, `gpu.count` on the
create). The CUDA asked of the host is the higher of the GPU class's floor (clouds/gpus.py) and the
image's own (its tag: `cu1281` is 12.8); the catalog lists only the data centers whose machines have
it, so a data center without one is skipped before any create, and the create carries the same
`gpu.minCudaVersion`. The candidate's `image` is used over the settings' one.

A candidate's `cache` is a network volume named `ar-cache-<name>` in the pod's data center (`GET
/v2/network-volumes`, made with `POST` when missing, never deleted by a run), mounted at the cache's
`mount` (`mounts.network` on the create: the pod then lands in that data center). A data center
that refuses the volume (400) starts cold; with `cache.required` only the data centers whose
`networkVolumeTypes` are not empty (`GET /v2/catalog/datacenters`) are offered. A pod is
ready when its `status` is RUNNING and `ssh.direct` is set. At its deadline a pod deletes itself:
connect() starts a detached script on it that calls `DELETE /v2/pods/<id>` with the pod-scoped
key RunPod injects into every pod (`RUNPOD_API_KEY`); our own key never goes there.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from actor_run.protocols.clouds.capabilities import Caching
from actor_run.protocols.clouds.gpus import (
    cuda_floor,
    cuda_text,
    gpu_class,
    gpu_count,
    image_cuda,
    our_name,
    shape,
    vendor_ids,
)
from actor_run.protocols.clouds.http import (
    NoAnswer,
    NotSent,
    ProviderAPI,
    body_json,
    is_auth_refusal,
    short,
)
from actor_run.protocols.clouds.rented import RentedCloud, RentedSettings, Seen, api_key
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchAmbiguous, LaunchRefused
from actor_run.protocols.hosts.scripts import q
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import CACHE_PREFIX, CacheSpec, CacheVolume, Machine, Offer
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # httpx (about 0.2 s of CPU) loads with the first call (http.py): none made, none loaded
    import httpx

VENDOR = "runpod"


class RunPodSettings(RentedSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    api_url: str = "https://api.runpod.io"
    api_key_env: str = "RUNPOD_API_KEY"
    image: str = "runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404"
    cloud: Literal["SECURE", "COMMUNITY"] = "SECURE"
    disk_gb: Annotated[int, msgspec.Meta(ge=1)] = 50
    # network volumes (a candidate's `cache`): $0.07 per GB-month for the first TB (RunPod's pricing,
    # https://docs.runpod.io/pods/storage/types); what `actor-run cost` shows for them
    cache_usd_per_gb_month: Annotated[float, msgspec.Meta(ge=0)] = 0.07


# What a create's answer means. RunPod says "no stock" with a 5xx, so the body decides, and only
# these refusals prove nothing was made; any other 5xx (or no answer) is ambiguous_create.
# (status, words in the body, code, the contract line it comes from)
CREATE_ANSWERS: list[tuple[int, str, Code, str]] = [
    (500, "no instances currently available", Code.NO_CAPACITY,
     'runpod.md §5: 500 {"error":"create pod: There are no instances currently available"}'),
    (500, "no longer any instances", Code.NO_CAPACITY,
     "runpod.md §5: the GraphQL wording, kept in the matcher"),
    (500, "does not have the resources", Code.NO_CAPACITY,
     'runpod.md §5: 500 "This machine does not have the resources to deploy your pod"'),
    (500, "balance is too low", Code.QUOTA,  # walks on: the next account, then the next candidate
     'runpod.md §5: 500 "Your account balance is too low to rent a pod"'),
    (500, "spot pods are no longer offered", Code.LAUNCH_FAILED,
     'runpod.md §2.2: 500 "create pod: Spot pods are no longer offered"'),
    (400, "", Code.LAUNCH_FAILED, "runpod-rest-v2.json createPod 400 BadRequestError: refused, nothing made"),
    (404, "", Code.LAUNCH_FAILED, "runpod-rest-v2.json createPod 404 NotFoundError (a template or volume)"),
    (422, "", Code.LAUNCH_FAILED, "runpod-rest-v2.json createPod 422 UnprocessableEntityError"),
    (401, "", Code.GUARD, "runpod-rest-v2.json 401 UnauthorizedError: stop, never retry"),
    (403, "", Code.GUARD, "runpod-rest-v2.json 403 ForbiddenError: the key lacks the right"),
]

# status -> what the pod is, in our words (runpod-rest-v2.json PodStatus; runpod.md Appendix A)
POD_STATES: dict[str, Literal["pending", "ready", "failed", "gone"]] = {
    "PROVISIONING": "pending", "STARTING": "pending", "RUNNING": "ready",  # RUNNING: ready once ssh.direct is set
    "EXITED": "failed", "ERROR": "failed", "TERMINATED": "gone",
}


def classify_create(status: int, body: str) -> Code | None:
    """The failure a create's refusal means, or None when it proves nothing (ambiguous)."""
    text = body.lower()
    for want, words, code, _ in CREATE_ANSWERS:
        if status == want and (not words or words in text):
            return code
    return None


def _when(value: Any) -> float:
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _price(value: Any) -> float:
    try:
        return float(value)  # runpod.md §2.3: a cost may come as a numeric string
    except (TypeError, ValueError):
        return 0.0


def seen_pod(pod: dict[str, Any]) -> Seen:
    status = str(pod.get("status", ""))
    state = POD_STATES.get(status, "pending")
    direct = (pod.get("ssh") or {}).get("direct") or {}
    if state == "ready" and not direct.get("host"):
        state = "pending"
    gpu = (pod.get("gpu") or {}).get("id", "")
    return Seen(
        id=str(pod.get("id", "")), name=str(pod.get("name", "")), state=state, detail=status,
        address=str(direct.get("host", "")), port=int(direct.get("port") or 22),
        user=str(direct.get("username") or "root"), hourly_usd=_price(pod.get("cost")),
        region=str(pod.get("dataCenterId") or ""), gpu=our_name(gpu, VENDOR) if gpu else "",
        created_at=_when(pod.get("createdAt")),
    )


_SELF_DELETE = r"""#!/bin/sh
# actor-run: this pod deletes itself at its deadline, with the pod-scoped key RunPod gives it
now=$(date +%s); [ {deadline} -gt "$now" ] && sleep $(({deadline} - now))
[ -n "$RUNPOD_API_KEY" ] || . /etc/rp_environment 2>/dev/null
key=${{RUNPOD_API_KEY:-$(tr '\0' '\n' </proc/1/environ 2>/dev/null | sed -n 's/^RUNPOD_API_KEY=//p')}}
i=0
while [ $i -lt 30 ]; do
  code=$(printf 'Authorization: Bearer %s\n' "$key" |
    curl -s -o /dev/null -w '%{{http_code}}' -m 30 -H @- -X DELETE {url})
  case "$code" in 2??|404) exit 0;; esac
  i=$((i + 1)); sleep 20
done
"""


class RunPodCloud(RentedCloud, Caching):
    # runpod.md §3: dataCenterIds:
    # a candidate's `regions` outside them is a typo (exit 2 before anything starts)
    regions = frozenset({
        "AP-JP-1", "CA-MTL-1", "CA-MTL-2", "CA-MTL-3", "EU-CZ-1", "EU-FR-1", "EU-NL-1", "EU-RO-1",
        "EU-SE-1", "EUR-IS-1", "EUR-IS-2", "EUR-IS-3", "EUR-NO-1", "OC-AU-1", "US-CA-2", "US-DE-1",
        "US-GA-1", "US-GA-2", "US-IL-1", "US-KS-2", "US-KS-3", "US-NC-1", "US-TX-1", "US-TX-3", "US-TX-4",
        "US-WA-1"
    })
    name = VENDOR
    settings: RunPodSettings

    def __init__(self, settings: RunPodSettings, state_dir: Path, *, transport: httpx.AsyncBaseTransport | None = None
                 ) -> None:
        super().__init__(settings, state_dir)
        key = api_key(self.name, settings.api_key_env)  # a missing key is exit 2, before anything starts
        self.api = ProviderAPI(self.name, settings.api_url, {"Authorization": f"Bearer {key}"},
                               timeout_s=settings.timeout_s, transport=transport)

    # --- offers -----------------------------------------------------------------------------------

    def _image(self, candidate_image: str) -> str:
        return candidate_image or self.settings.image

    def needed_cuda(self, gpu: str, image: str) -> tuple[int, int] | None:
        """The host CUDA a pod of `gpu` booting `image` needs: the higher of the class's floor and the image's."""
        wants = [v for v in (cuda_floor(gpu), image_cuda(image)) if v is not None]
        return max(wants) if wants else None

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        count = gpu_count(candidate.gpu)
        image = self._image(candidate.image)
        params = {"include": "AVAILABILITY", "product": "POD", "cloud": self.settings.cloud, "count": str(count)}
        need = self.needed_cuda(candidate.gpu, image)
        if need is not None:
            params["minCudaVersion"] = cuda_text(need)
        resp = await self.api.call("GET", "/v2/catalog/gpus", params=params)
        if is_auth_refusal(resp.status_code):
            raise LaunchRefused(f"runpod: the key was refused: {short(resp)}", code=Code.GUARD)
        if resp.status_code != 200:
            raise NoAnswer(f"runpod: the GPU catalog: {short(resp)}")
        wanted = vendor_ids(candidate.gpu, VENDOR)
        price_key = "secure" if self.settings.cloud == "SECURE" else "community"
        out: list[Offer] = []
        for gpu in (body_json(resp) or {}).get("gpus", []):
            if wanted and gpu.get("id") not in wanted:
                continue
            if int((gpu.get("maxCount") or {}).get(price_key) or 1) < count:
                continue  # no machine of this type has that many
            price = round(_price((gpu.get("price") or {}).get(price_key)) * count, 4)  # the pod's, not one GPU's
            if candidate.max_hourly_usd is not None and price > candidate.max_hourly_usd:
                continue
            for dc in gpu.get("dataCenters") or []:
                if dc.get("availability", "NONE") == "NONE":
                    continue
                if candidate.regions and dc.get("id") not in candidate.regions:
                    continue
                ours = shape(gpu_class(candidate.gpu) or our_name(gpu["id"], VENDOR), count)
                out.append(Offer(cloud=self.name, region=str(dc["id"]), gpu=ours, hourly_usd=price, candidate=index,
                                 kind=str(gpu["id"]), stock=str(dc.get("availability", "")).lower(), image=image))
        if candidate.cache is not None and candidate.cache.required:  # only where a volume can be
            hosts = await self._volume_data_centers()
            out = [o for o in out if o.region in hosts]
        out.sort(key=lambda o: (o.hourly_usd, o.region))
        return out

    async def _volume_data_centers(self) -> set[str]:
        """The data centers that keep network volumes (`GET /v2/catalog/datacenters`: a non-empty
        `networkVolumeTypes`)."""
        resp = await self.api.call("GET", "/v2/catalog/datacenters")
        if resp.status_code != 200:
            raise self._refused_read("data centers", resp)
        return {str(dc.get("id")) for dc in (body_json(resp) or {}).get("dataCenters") or []
                if dc.get("networkVolumeTypes")}

    # --- the machine ------------------------------------------------------------------------------

    async def _create(self, offer: Offer, name: str, deadline: float) -> str:
        s = self.settings
        image = offer.image or s.image
        gpu: dict[str, Any] = {"id": offer.kind or vendor_ids(offer.gpu, VENDOR)[0], "count": gpu_count(offer.gpu)}
        need = self.needed_cuda(offer.gpu, image)
        if need is not None:
            gpu["minCudaVersion"] = cuda_text(need)
        body = {
            "name": name, "image": image, "cloud": s.cloud, "disk": s.disk_gb, "ports": ["22/tcp"], "gpu": gpu,
            "dataCenterIds": [offer.region] if offer.region else [],
            **({"mounts": {"network": [{"volumeId": offer.cache, "path": offer.cache_path}]}} if offer.cache else {}),
            "env": {"PUBLIC_KEY": self._public_key}, "startSsh": True,
        }
        try:
            resp = await self.api.call("POST", "/v2/pods", json=body)
        except NotSent as exc:  # it never left: nothing can have been made
            raise LaunchRefused(f"runpod: the create of {name}: {exc}", code=Code.LAUNCH_FAILED) from exc
        except NoAnswer as exc:
            raise LaunchAmbiguous(f"runpod: the create of {name}: {exc}") from exc
        if resp.status_code in (200, 201):
            pod = body_json(resp) or {}
            if pod.get("id"):
                return str(pod["id"])
            raise LaunchAmbiguous(f"runpod: the create of {name} was accepted without an id: {short(resp)}")
        code = classify_create(resp.status_code, resp.text)
        if code is None:  # a 5xx that is not a refusal, or an answer we do not know: it may have made one
            raise LaunchAmbiguous(f"runpod: the create of {name}: {short(resp)}")
        raise LaunchRefused(f"runpod: the create of {name} was refused: {short(resp)}", code=code)

    # --- cache volumes ----------------------------------------------------------------------------

    @property
    def cache_usd_per_gb_month(self) -> float:
        return self.settings.cache_usd_per_gb_month

    def _volume(self, v: dict[str, Any], path: str = "", created: bool = False) -> CacheVolume:
        return CacheVolume(cloud=self.name, id=str(v.get("id", "")), name=str(v.get("name", "")),
                           region=str(v.get("dataCenter", "")), size_gb=int(v.get("size") or 0), path=path,
                           created=created)

    async def list_caches(self) -> list[CacheVolume]:
        """Every network volume of ours (named ar-cache-*) the account holds."""
        resp = await self.api.call("GET", "/v2/network-volumes")
        if resp.status_code != 200:
            raise self._refused_read("network volumes", resp)
        return [self._volume(v) for v in (body_json(resp) or {}).get("networkVolumes") or []
                if str(v.get("name", "")).startswith(CACHE_PREFIX)]

    async def _named(self, cache: CacheSpec, region: str) -> list[CacheVolume]:
        """The cache's volumes in a data center, the one every controller uses first (the least id)."""
        return sorted((v for v in await self.list_caches() if v.name == cache.volume_name and v.region == region),
                      key=lambda v: v.id)

    async def open_cache(self, offer: Offer, cache: CacheSpec) -> CacheVolume | None:
        """The cache's volume in the offer's data center: found, or made; None when the data center
        refuses one (a cold start there). RunPod's names are not unique: two controllers that
        open one cache at once each make a volume, so after a create it looks again and, when
        another has the least id, deletes its own (empty, attached to nothing) and uses that one.
        A create that saw only its own keeps it; later opens all take the least id."""
        found = await self._named(cache, offer.region)
        if found:
            return msgspec.structs.replace(found[0], path=cache.mount)
        body = {"name": cache.volume_name, "size": max(10, cache.size_gb), "dataCenter": offer.region}
        resp = await self.api.call("POST", "/v2/network-volumes", json=body)
        if resp.status_code in (400, 422):
            return None  # this data center keeps no network volumes: nothing was made
        if resp.status_code not in (200, 201):
            raise self._refused_read(f"creating network volume {cache.volume_name}", resp)
        made = self._volume(body_json(resp) or {}, cache.mount, created=True)
        first = (await self._named(cache, offer.region) or [made])[0]
        if first.id == made.id or not made.id:
            return made
        try:
            await self.delete_cache(made.id)
        except (NoAnswer, LaunchRefused) as exc:  # left for `actor-run caches`, which lists it
            logger.warning("runpod: network volume {} (a second {} in {}) could not be deleted: {}", made.id,
                           cache.volume_name, offer.region, exc)
        return msgspec.structs.replace(first, path=cache.mount)

    async def delete_cache(self, volume_id: str) -> None:
        resp = await self.api.call("DELETE", f"/v2/network-volumes/{volume_id}")
        if resp.status_code not in (200, 204, 404):
            raise self._refused_read(f"deleting network volume {volume_id}", resp)

    def _refused_read(self, what: str, resp: httpx.Response) -> Exception:
        if is_auth_refusal(resp.status_code):
            return LaunchRefused(f"runpod: {what}: the key was refused: {short(resp)}", code=Code.GUARD)
        return NoAnswer(f"runpod: {what}: {short(resp)}")

    async def _read(self, machine_id: str) -> Seen | None:
        resp = await self.api.call("GET", f"/v2/pods/{machine_id}")
        if resp.status_code == 404:
            return None
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"runpod: reading pod {machine_id}: the key was refused: {short(resp)}")
        if resp.status_code != 200:
            raise NoAnswer(f"runpod: reading pod {machine_id}: {short(resp)}")
        return seen_pod(body_json(resp) or {})

    async def _list(self) -> list[Seen]:
        resp = await self.api.call("GET", "/v2/pods")
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"runpod: listing pods: the key was refused: {short(resp)}")
        if resp.status_code != 200:
            raise NoAnswer(f"runpod: listing pods: {short(resp)}")
        return [seen_pod(p) for p in (body_json(resp) or {}).get("pods", [])]

    async def _delete_call(self, machine_id: str) -> None:
        resp = await self.api.call("DELETE", f"/v2/pods/{machine_id}")
        if resp.status_code in (200, 204, 404):
            return
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"runpod: deleting pod {machine_id}: the key was refused: {short(resp)}")
        # runpod.md §3: a delete answered 500 had worked; the read that follows says
        raise NoAnswer(f"runpod: deleting pod {machine_id}: {short(resp)}")

    def _deadline_script(self, machine: Machine) -> str:
        url = f"{self.settings.api_url.rstrip('/')}/v2/pods/{machine.id}"
        return _SELF_DELETE.format(deadline=int(machine.deadline), url=q(url))

    async def aclose(self) -> None:
        await self.api.aclose()


__all__ = ["CREATE_ANSWERS", "POD_STATES", "RunPodCloud", "RunPodSettings", "classify_create", "seen_pod"]
