"""The `lambda` cloud: Lambda on-demand instances over the Lambda Cloud API v1 (`/api/v1/...`).

Settings (`[clouds.lambda]`), every field optional (and those of clouds/rented.py)::

    api_url = "https://cloud.lambda.ai"
    api_key_env = "LAMBDA_API_KEY"
    ssh_key = "~/.ssh/id_ed25519"      # its public half is registered once as an ssh-key named
                                       # actor-run-<hash> (or an existing one with that key is used)
    root = "~/.actor-run"
    file_system = ""                   # a file system to attach: offers are limited to its region
    user = "ubuntu"                    # the login on Lambda's images
    shutdown_command = "sudo -n shutdown -h now"

Offers come from `GET /api/v1/instance-types`: one per region in `regions_with_capacity_available`
of each instance type our GPU name maps to, at `price_cents_per_hour` (the instance's). A shape with
a count (`A100:8`) takes the types whose `specs.gpus` is that count and whose `gpu_description` is
the one the catalog gives our GPU's one-GPU types: found in the catalog, never by guessing names.
Images: a candidate's `image` (or the settings') wins, launched as `{"family": image}` (or `{"id":
image}` when it is an image's name in the region's listing). Unset, the image is chosen per region
from `GET /api/v1/images` (read once): of the region's images whose name, description or version
says a CUDA (clouds/gpus.py `image_cuda`) at or above the GPU class's floor (`CUDA_FLOOR`), the one
with the newest CUDA, launched by its id; a region with none has no offer (skipped before any
create; `plan` says nothing is in stock there). A GPU class the table does not know takes Lambda's
default (Lambda Stack).

A candidate's `cache` is a file system per region, named `ar-cache-<name>-<region>` (`GET
/file-systems`, made with `POST /filesystems` when missing, never deleted by a run), attached at
launch (`file_system_names`) and mounted at the cache's `mount` when Lambda allows that path
(under /home, /lambda/nfs or /data: `file_system_mounts`), else at its own mount point
(`/lambda/nfs/<name>`). A region that refuses one starts cold. With a `file_system`, only
its region (read once from `GET /api/v1/file-systems`; a launch elsewhere is refused
`file-system-in-wrong-region`); a file system the account does not have is a `SpecError`, raised
by `check()` before anything starts. An instance is ready when
its status is `active` and it has an `ip`. Names are at most 64 characters at Lambda: a longer
one of ours is cut (clouds/rented.py `vendor_name`) and the whole name rides in the tag
`actor-run-name`. Lambda has no means for a machine to end itself without the account's key, so
the deadline on the machine is an OS shutdown (Lambda keeps billing a shut-down instance: the
sweep deletes it; the README says so).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio

from actor_run.protocols.clouds.capabilities import Caching, Checking, PassingOver
from actor_run.protocols.clouds.gpus import (
    cuda_floor,
    gpu_class,
    gpu_count,
    image_cuda,
    newest_image,
    no_image,
    our_name,
    shape,
    vendor_ids,
)
from actor_run.protocols.clouds.http import NoAnswer, NotSent, ProviderAPI, body_json, is_auth_refusal, short
from actor_run.protocols.clouds.rented import (
    RentedCloud,
    Seen,
    VMSettings,
    api_key,
    shutdown_script,
    vendor_name,
)
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchAmbiguous, LaunchRefused, SpecError
from actor_run.protocols.messages import CACHE_PREFIX, CacheSpec, CacheVolume, Machine, Offer
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # httpx (about 0.2 s of CPU) loads with the first call (http.py): none made, none loaded
    import httpx

VENDOR = "lambda"
NAME_LIMIT = 64  # lambda-v1.json InstanceLaunchRequest.name maxLength
NAME_TAG = "actor-run-name"
Image = tuple[str, str, tuple[int, int] | None]  # an image's name, its id, and the CUDA its words say
LAMBDA_MOUNT = re.compile(r"(/home|/lambda/nfs|/data)[/a-zA-Z0-9-]*")  # lambda-v1.json RequestedFilesystemMountEntry


class LambdaSettings(VMSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    api_url: str = "https://cloud.lambda.ai"
    api_key_env: str = "LAMBDA_API_KEY"
    file_system: str = ""
    image: str = ""  # an image family (GET /api/v1/images); default: Lambda's (Lambda Stack)
    # file systems (a candidate's `cache`): $0.20 per GB-month (Lambda's pricing page, persistent
    # storage); what `actor-run cost` shows for them
    cache_usd_per_gb_month: float = 0.20


# What a launch's refusal means: Lambda names each with `error.code` (branch on it, never on the
# message: lambda.md §1). Anything else, a 5xx (`provider/*`) or no answer, is ambiguous_create.
# (status, error.code, code, the contract line it comes from)
LAUNCH_ANSWERS: list[tuple[int, str, Code, str]] = [
    (400, "instance-operations/launch/insufficient-capacity", Code.NO_CAPACITY,
     "lambda.md §4: 400 instance-operations/launch/insufficient-capacity"),
    (400, "global/quota-exceeded", Code.QUOTA, "lambda.md §4: 400 global/quota-exceeded (the next account)"),
    (400, "global/invalid-parameters", Code.LAUNCH_FAILED, "lambda.md §4: 400 global/invalid-parameters"),
    (400, "instance-operations/launch/file-system-in-wrong-region", Code.LAUNCH_FAILED,
     "lambda.md §4: 400 instance-operations/launch/file-system-in-wrong-region"),
    (400, "global/object-does-not-exist", Code.LAUNCH_FAILED, "lambda.md §4: 400/404 global/object-does-not-exist"),
    (404, "global/object-does-not-exist", Code.LAUNCH_FAILED, "lambda.md §4: 400/404 global/object-does-not-exist"),
    (401, "global/invalid-api-key", Code.GUARD, "lambda.md §4: 401 global/invalid-api-key"),
    (403, "global/account-inactive", Code.GUARD, "lambda.md §4: 403 global/account-inactive"),
    (403, "global/invalid-address", Code.GUARD, "lambda.md §4: 403 global/invalid-address"),
]

# status -> ours (lambda-v1.json InstanceStatus; lambda.md §3). `terminating` is not gone yet:
# a deletion is proven only by `terminated` or a 404.
INSTANCE_STATES: dict[str, Literal["pending", "ready", "failed", "gone"]] = {
    "booting": "pending", "active": "ready", "unhealthy": "pending", "terminating": "failed",
    "terminated": "gone", "preempted": "gone",
}


def error_code(resp: httpx.Response) -> str:
    body = body_json(resp)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("code", ""))
    return ""


def classify_launch(status: int, code: str) -> Code | None:
    """The failure a launch's refusal means, or None when it proves nothing (ambiguous)."""
    for want, want_code, ours, _ in LAUNCH_ANSWERS:
        if status == want and code == want_code:
            return ours
    if status in (401, 403):
        return Code.GUARD
    return None


def seen_instance(inst: dict[str, Any], user: str, port: int) -> Seen:
    status = str(inst.get("status", ""))
    state = INSTANCE_STATES.get(status, "pending")
    ip = str(inst.get("ip") or "")
    if state == "ready" and not ip:
        state = "pending"
    tags = {t.get("key"): t.get("value") for t in inst.get("tags") or []}
    itype = inst.get("instance_type") or {}
    return Seen(
        id=str(inst.get("id", "")), name=str(tags.get(NAME_TAG) or inst.get("name") or ""), state=state,
        detail=status, address=ip, port=port, user=user,
        hourly_usd=float(itype.get("price_cents_per_hour") or 0) / 100.0,
        region=str((inst.get("region") or {}).get("name", "")), gpu=our_name(str(itype.get("name", "")), VENDOR),
    )


class LambdaCloud(RentedCloud, Checking, Caching, PassingOver):
    # Lambda's region codes (lambda.md §2, GET /regions):
    # a candidate's `regions` outside them is a typo (exit 2 before anything starts)
    regions = frozenset({
        "asia-northeast-1", "asia-northeast-2", "asia-south-1", "australia-east-1", "europe-central-1",
        "me-west-1", "us-east-1", "us-east-2", "us-east-3", "us-midwest-1", "us-south-1", "us-south-2",
        "us-south-3", "us-west-1", "us-west-2", "us-west-3"
    })
    name = VENDOR
    settings: LambdaSettings

    def __init__(self, settings: LambdaSettings, state_dir: Path, *, transport: httpx.AsyncBaseTransport | None = None
                 ) -> None:
        super().__init__(settings, state_dir)
        key = api_key(self.name, settings.api_key_env)
        self.api = ProviderAPI(self.name, settings.api_url, {"Authorization": f"Bearer {key}"},
                               timeout_s=settings.timeout_s, transport=transport)
        self._key_name = ""
        self._key_lock = trio.Lock()
        self._fs_region: str | None = None  # the file system's region, once read
        self._fs_names: dict[str, str] = {}  # a cache file system's id -> its name (a launch names it)
        self._fs_lock = trio.Lock()
        self._images: dict[str, list[Image]] | None = None  # region -> its images, read once
        self._passed_over: dict[int, list[str]] = {}  # candidate -> what its last offers left out, and why
        self._images_lock = trio.Lock()

    def _refused(self, what: str, resp: httpx.Response) -> Exception:
        if is_auth_refusal(resp.status_code):
            return LaunchRefused(f"lambda: {what}: the key was refused: {short(resp)}", code=Code.GUARD)
        return NoAnswer(f"lambda: {what}: {short(resp)}")

    async def check(self) -> None:
        """Before anything starts: the settings' file system exists (SpecError names the field)."""
        await self._file_system_region()

    async def _file_system_region(self) -> str:
        """The region of the settings' `file_system` ("" for none), read once."""
        fs = self.settings.file_system
        if not fs:
            return ""
        async with self._fs_lock:
            if self._fs_region is None:
                have = {str(f.get("name")): str((f.get("region") or {}).get("name", ""))
                        for f in await self._file_systems()}
                if fs not in have:
                    listed = ", ".join(sorted(have)) or "none"
                    raise SpecError(f"clouds.{self.name}.file_system",
                                    f"no file system named {fs!r} on this account (it has: {listed})")
                self._fs_region = have[fs]
            return self._fs_region

    async def _region_images(self, region: str) -> list[Image]:
        """A region's images as (name, id, the CUDA its words say), from `GET /api/v1/images` read once."""
        async with self._images_lock:
            if self._images is None:
                resp = await self.api.call("GET", "/api/v1/images")
                if resp.status_code != 200:
                    raise self._refused("images", resp)
                found: dict[str, list[Image]] = {}
                for i in (body_json(resp) or {}).get("data") or []:
                    words = (str(i.get(k) or "") for k in ("name", "description", "version"))
                    cuda = next((v for w in words if (v := image_cuda(w)) is not None), None)
                    found.setdefault(str((i.get("region") or {}).get("name", "")), []).append(
                        (str(i.get("name", "")), str(i.get("id", "")), cuda))
                self._images = found
            return self._images.get(region, [])

    async def image_for(self, gpu: str, region: str, named: str) -> str:
        """The image a machine of `gpu` boots in `region`: `named` when given (the user's wins);
        else the name of the region's image with the newest CUDA at or above the class's floor ("" when
        there is none: the region is skipped); "" too for a class without a floor (Lambda's default)."""
        if named:
            return named
        floor = cuda_floor(gpu)
        if floor is None:
            return ""
        images = await self._region_images(region)
        return newest_image(((name, cuda) for name, _, cuda in images), floor)

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        fs_region = await self._file_system_region()
        resp = await self.api.call("GET", "/api/v1/instance-types")
        if resp.status_code != 200:
            raise self._refused("instance types", resp)
        wanted = vendor_ids(candidate.gpu, VENDOR)
        count = gpu_count(candidate.gpu)
        catalog = dict((body_json(resp) or {}).get("data") or {})
        # the GPU our name means, as this catalog describes it on the one-GPU types the table names
        described = {str(item["instance_type"].get("gpu_description")) for name, item in catalog.items()
                     if name in wanted}
        out: list[Offer] = []
        passed: list[str] = []
        for type_name, item in catalog.items():
            gpus = int((item["instance_type"].get("specs") or {}).get("gpus") or 1)
            if wanted and not (type_name in wanted if count == 1 else
                               gpus == count and str(item["instance_type"].get("gpu_description")) in described):
                continue
            if gpus != count:
                continue
            price = float(item["instance_type"]["price_cents_per_hour"]) / 100.0
            if candidate.max_hourly_usd is not None and price > candidate.max_hourly_usd:
                continue
            for region in item.get("regions_with_capacity_available") or []:
                if candidate.regions and region["name"] not in candidate.regions:
                    continue
                if fs_region and region["name"] != fs_region:  # the file system mounts only there
                    continue
                ours = shape(gpu_class(candidate.gpu) or our_name(type_name, VENDOR), count)
                named = candidate.image or self.settings.image
                image = await self.image_for(ours, region["name"], named)
                if not image and cuda_floor(ours) is not None:  # skipped before any create
                    passed.append(no_image(region["name"], ours))
                    continue
                out.append(Offer(cloud=self.name, region=region["name"], gpu=ours, hourly_usd=price, candidate=index,
                                 kind=type_name, stock="available", image=image))
        self._passed_over[index] = sorted(set(passed))
        out.sort(key=lambda o: (o.hourly_usd, o.region, o.kind))
        return out

    def passed_over(self, index: int) -> list[str]:
        return list(self._passed_over.get(index, []))

    async def _ssh_key_name(self) -> str:
        """The name of an ssh-key holding our public key: found, or registered once."""
        async with self._key_lock:
            if self._key_name:
                return self._key_name
            mine = " ".join(self._public_key.split()[:2])
            resp = await self.api.call("GET", "/api/v1/ssh-keys")
            if resp.status_code != 200:
                raise self._refused("ssh keys", resp)
            for k in (body_json(resp) or {}).get("data") or []:
                if " ".join(str(k.get("public_key", "")).split()[:2]) == mine:
                    self._key_name = str(k["name"])
                    return self._key_name
            name = "actor-run-" + hashlib.sha256(mine.encode()).hexdigest()[:12]
            resp = await self.api.call("POST", "/api/v1/ssh-keys", json={"name": name, "public_key": mine})
            if resp.status_code != 200:
                raise self._refused("registering the ssh key", resp)
            self._key_name = name
            return name

    async def _create(self, offer: Offer, name: str, deadline: float) -> str:
        try:
            key_name = await self._ssh_key_name()
        except NoAnswer as exc:  # nothing was launched yet: a clean refusal
            raise LaunchRefused(f"lambda: {exc}", code=Code.LAUNCH_FAILED) from exc
        body: dict[str, Any] = {
            "region_name": offer.region, "instance_type_name": offer.kind or vendor_ids(offer.gpu, VENDOR)[0],
            "ssh_key_names": [key_name], "name": vendor_name(name, NAME_LIMIT),
            "tags": [{"key": NAME_TAG, "value": name}],
        }
        if self.settings.file_system:
            body["file_system_names"] = [self.settings.file_system]
        # the cache's file system (lambda.md: at most one, in the launch's region); never an unnamed one
        if offer.cache and offer.cache in self._fs_names:
            body["file_system_names"] = [self._fs_names[offer.cache]]
            if LAMBDA_MOUNT.fullmatch(offer.cache_path):
                body["file_system_mounts"] = [{"mount_point": offer.cache_path, "file_system_id": offer.cache}]
        if offer.image:  # the chosen image by its id; a user's image that is no name here, as a family
            try:
                listed = {n: i for n, i, _ in await self._region_images(offer.region)}
            except NoAnswer as exc:  # nothing was launched yet: a clean refusal
                raise LaunchRefused(f"lambda: {exc}", code=Code.LAUNCH_FAILED) from exc
            image_id = listed.get(offer.image)
            body["image"] = {"id": image_id} if image_id else {"family": offer.image}
        try:
            resp = await self.api.call("POST", "/api/v1/instance-operations/launch", json=body)
        except NotSent as exc:  # it never left: nothing can have been made
            raise LaunchRefused(f"lambda: the launch of {name}: {exc}", code=Code.LAUNCH_FAILED) from exc
        except NoAnswer as exc:
            raise LaunchAmbiguous(f"lambda: the launch of {name}: {exc}") from exc
        if resp.status_code == 200:
            ids = ((body_json(resp) or {}).get("data") or {}).get("instance_ids") or []
            if ids:
                return str(ids[0])
            raise LaunchAmbiguous(f"lambda: the launch of {name} was accepted without an id: {short(resp)}")
        code = classify_launch(resp.status_code, error_code(resp))
        if code is None:
            raise LaunchAmbiguous(f"lambda: the launch of {name}: {short(resp)}")
        raise LaunchRefused(f"lambda: the launch of {name} was refused: {short(resp)}", code=code)

    # --- cache file systems ------------------------------------------------------------------------

    @property
    def cache_usd_per_gb_month(self) -> float:
        return self.settings.cache_usd_per_gb_month

    def _fs_volume(self, f: dict[str, Any], cache_name: str, path: str = "", created: bool = False) -> CacheVolume:
        self._fs_names[str(f.get("id", ""))] = str(f.get("name", ""))
        return CacheVolume(cloud=self.name, id=str(f.get("id", "")), name=cache_name,
                           region=str((f.get("region") or {}).get("name", "")),
                           path=path or str(f.get("mount_point", "")), created=created)

    async def _file_systems(self) -> list[dict[str, Any]]:
        """The account's file systems, as `GET /api/v1/file-systems` lists them."""
        resp = await self.api.call("GET", "/api/v1/file-systems")
        if resp.status_code != 200:
            raise self._refused("file systems", resp)
        return [f for f in (body_json(resp) or {}).get("data") or [] if isinstance(f, dict)]

    async def list_caches(self) -> list[CacheVolume]:
        """Every file system of ours (ar-cache-<name>-<region>), as the cache it holds (`name`: ar-cache-<name>)."""
        out = []
        for f in await self._file_systems():
            name, region = str(f.get("name", "")), str((f.get("region") or {}).get("name", ""))
            if name.startswith(CACHE_PREFIX) and name.endswith(f"-{region}"):
                out.append(self._fs_volume(f, name.removesuffix(f"-{region}")))
        return out

    async def open_cache(self, offer: Offer, cache: CacheSpec) -> CacheVolume | None:
        """The cache's file system in the offer's region: found, or made; None when the region refuses
        one (a cold start there)."""
        path = cache.mount if LAMBDA_MOUNT.fullmatch(cache.mount) else ""

        async def found() -> CacheVolume | None:
            for v in await self.list_caches():
                if v.name == cache.volume_name and v.region == offer.region:
                    return msgspec.structs.replace(v, path=path or v.path)
            return None

        if (have := await found()) is not None:
            return have
        fs_name = f"{cache.volume_name}-{offer.region}"
        resp = await self.api.call("POST", "/api/v1/filesystems", json={"name": fs_name, "region": offer.region})
        if resp.status_code == 200:
            return self._fs_volume((body_json(resp) or {}).get("data") or {}, cache.volume_name, path, created=True)
        error = (body_json(resp) or {}).get("error") if resp.status_code == 400 else None
        if isinstance(error, dict) and error.get("code") == "global/duplicate":
            # another lease or controller made it since the listing (lambda.md: ApiErrorDuplicate): use it
            return await found()
        if resp.status_code in (400, 404):
            return None  # this region keeps no file system for us: nothing was made
        raise self._refused(f"creating file system {fs_name}", resp)

    async def delete_cache(self, volume_id: str) -> None:
        resp = await self.api.call("DELETE", f"/api/v1/filesystems/{volume_id}")
        if resp.status_code not in (200, 404):
            raise self._refused(f"deleting file system {volume_id}", resp)

    def _seen(self, inst: dict[str, Any]) -> Seen:
        return seen_instance(inst, self.settings.user, self.settings.ssh_port)

    async def _read(self, machine_id: str) -> Seen | None:
        resp = await self.api.call("GET", f"/api/v1/instances/{machine_id}")
        if resp.status_code == 404:
            return None
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"lambda: reading {machine_id}: the key was refused: {short(resp)}")
        if resp.status_code != 200:
            raise NoAnswer(f"lambda: reading {machine_id}: {short(resp)}")
        return self._seen((body_json(resp) or {}).get("data") or {})

    async def _list(self) -> list[Seen]:
        resp = await self.api.call("GET", "/api/v1/instances")
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"lambda: listing instances: the key was refused: {short(resp)}")
        if resp.status_code != 200:
            raise NoAnswer(f"lambda: listing instances: {short(resp)}")
        return [self._seen(i) for i in (body_json(resp) or {}).get("data") or []]

    async def _delete_call(self, machine_id: str) -> None:
        resp = await self.api.call("POST", "/api/v1/instance-operations/terminate",
                                   json={"instance_ids": [machine_id]})
        if resp.status_code in (200, 404):  # lambda.md §5: an unknown id is 404 global/object-does-not-exist
            return
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"lambda: terminating {machine_id}: the key was refused: {short(resp)}")
        raise NoAnswer(f"lambda: terminating {machine_id}: {short(resp)}")

    def _deadline_script(self, machine: Machine) -> str:
        return shutdown_script(machine.deadline, self.settings.shutdown_command)

    async def aclose(self) -> None:
        await self.api.aclose()


__all__ = ["INSTANCE_STATES", "LAUNCH_ANSWERS", "LambdaCloud", "LambdaSettings", "classify_launch", "seen_instance"]
