"""The `hyperstack` cloud: Hyperstack (NexGen Infrahub) VMs over its API v1 (`/v1/core/...`).

Settings (`[clouds.hyperstack]`), every field optional (and those of clouds/rented.py)::

    api_url = "https://infrahub-api.nexgencloud.com/v1"
    api_key_env = "HYPERSTACK_API_KEY"   # sent as the header `api_key`
    ssh_key = "~/.ssh/id_ed25519"        # imported once per environment as keypair actor-run-<hash>
    root = "~/.actor-run"
    environment = "actor-run-{region}"   # the environment per region ({region} filled in), made if missing
    image = ""                           # default: per region, the image whose CUDA is newest, at or above
                                         # the GPU class's floor (a candidate's `image` wins)
    volume_type = "Cloud-SSD"            # a cache's volume (GET /core/volume-types lists them)
    cache_attach_wait_s = 180            # attach to attached (and a dying VM's volume let go)
    cache_usd_per_gb_month = 0           # 0: the price book's volume_type (per GB-hour) x 730
    user = "ubuntu"
    shutdown_command = "sudo -n shutdown -h now"

Offers: `GET /core/flavors` (the flavors of our GPU whose `gpu_count` is the shape's count, `H100:8`
eight, with `stock_available`), `GET /core/stocks` (a model whose `available` bucket is "0" in a
region is out there) and `GET /pricebook` (per GPU-hour, times the count, plus the public IP).
Images: `GET /core/images?region=<region>` once per region; an image's CUDA is read from its name
("... R535 CUDA 12.2"); a region with no image at or above the GPU class's CUDA floor
(clouds/gpus.py `CUDA_FLOOR`), or without the image named, has no offer: skipped before any create.
A VM is ready when its status is ACTIVE and it has a `floating_ip`; SSH is opened by a port-22 rule
added right after the create. Names are at most 50 characters: a longer one of ours is cut and the
whole name rides in the label `ar-name=<name>`. Every answer's `status` is checked, even on HTTP 200
(hyperstack.md §1). A candidate's `cache` is a block volume per region, found or made before the
create, attached and mounted once the VM runs (hyperstack_volumes.py). The deadline on the
machine is an OS shutdown (a SHUTOFF VM still bills: the sweep is the real backstop).
"""

from __future__ import annotations

import datetime
import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import trio

from actor_run.protocols.clouds.capabilities import CacheAttaching, Caching, PassingOver
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
from actor_run.protocols.clouds.http import (
    NoAnswer,
    NotSent,
    ProviderAPI,
    RateLimited,
    body_json,
    is_auth_refusal,
    short,
)
from actor_run.protocols.clouds.hyperstack_volumes import HyperstackVolumes
from actor_run.protocols.clouds.rented import (
    RentedCloud,
    Seen,
    VMSettings,
    api_key,
    public_key,
    shutdown_script,
    vendor_name,
)
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchAmbiguous, LaunchRefused
from actor_run.protocols.hosts.workspace import Workspace
from actor_run.protocols.messages import CacheSpec, CacheVolume, Machine, Offer
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # httpx (about 0.2 s of CPU) loads with the first call (http.py): none made, none loaded
    import httpx

VENDOR = "hyperstack"
NAME_LIMIT = 50  # hyperstack-v1.yaml Create_Instances_Payload.name maxLength
NAME_LABEL = "ar-name="
PAGE = 200


class HyperstackSettings(VMSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    api_url: str = "https://infrahub-api.nexgencloud.com/v1"
    api_key_env: str = "HYPERSTACK_API_KEY"
    environment: str = "actor-run-{region}"
    image: str = ""
    volume_type: str = "Cloud-SSD"
    cache_attach_wait_s: Annotated[float, msgspec.Meta(gt=0)] = 180.0
    cache_usd_per_gb_month: Annotated[float, msgspec.Meta(ge=0)] = 0.0


# What a create's answer means (status, words in its message, code, the contract line). Hyperstack
# documents no out-of-stock message: a refusal with `status: false` is taken as no capacity.
CREATE_ANSWERS: list[tuple[int, str, Code, str]] = [
    (400, "insufficient balance", Code.QUOTA,
     'hyperstack.md §4: 400 {"status": false, "message": "Insufficient balance to create the resource"}'),
    (200, "", Code.NO_CAPACITY, "hyperstack.md §1: HTTP 200 with status false is a refusal"),
    (400, "", Code.NO_CAPACITY, "hyperstack.md §4: any other 400 status false (no out-of-stock message is documented)"),
    (404, "", Code.LAUNCH_FAILED, "hyperstack.md §4: 404 not_found (environment, flavor, image or key)"),
    (405, "", Code.LAUNCH_FAILED, "hyperstack.md §4: 405 not_allowed"),
    (401, "", Code.GUARD, "hyperstack.md §4: 401 unauthorized"),
    (403, "", Code.GUARD, "hyperstack.md §4: 403 forbidden"),
    # 409 already_exist: a VM with our unique name exists, so a create of ours made it: ambiguous
    # (hyperstack.md §5); a 5xx or no answer: ambiguous as well
]

# status -> ours (hyperstack.md §3). ERROR after an accepted create: the place could not build it
# (hyperstack.md §4: treat as capacity). DELETING is not gone: a deletion is proven by a 404.
VM_STATES: dict[str, Literal["pending", "ready", "failed", "gone"]] = {
    "CREATING": "pending", "BUILD": "pending", "STARTING": "pending", "REBOOTING": "pending",
    "ACTIVE": "ready", "ERROR": "failed", "FAILED": "failed", "DELETING": "failed", "SHUTOFF": "failed",
    "STOPPING": "failed", "HIBERNATING": "failed", "HIBERNATED": "failed", "DELETED": "gone", "TERMINATED": "gone",
}


def classify_create(status: int, body: Any) -> Code | None:
    """The failure a create's refusal means, or None when it proves nothing (ambiguous)."""
    if status == 200 and isinstance(body, dict) and body.get("status") is not False:
        return None  # not a refusal
    message = str(body.get("message", "")).lower() if isinstance(body, dict) else ""
    for want, words, code, _ in CREATE_ANSWERS:
        if status == want and words in message:
            return code
    return None


def _when(value: Any) -> float:
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


class HyperstackCloud(RentedCloud, Caching, CacheAttaching, PassingOver):
    # hyperstack.md §2.3: regions seen:
    # a candidate's `regions` outside them is a typo (exit 2 before anything starts)
    regions = frozenset({
        "CANADA-1", "NORWAY-1", "US-1"
    })
    name = VENDOR
    failed_code = Code.NO_CAPACITY
    settings: HyperstackSettings

    def __init__(self, settings: HyperstackSettings, state_dir: Path, *,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(settings, state_dir)
        key = api_key(self.name, settings.api_key_env)
        self.api = ProviderAPI(self.name, settings.api_url, {"api_key": key}, timeout_s=settings.timeout_s,
                               transport=transport)
        self._ready_envs: set[str] = set()
        self._env_lock = trio.Lock()
        self._prices: dict[str, float] = {}
        self._images: dict[str, list[str]] = {}  # region -> its image names, read once
        self._images_lock = trio.Lock()
        self._passed_over: dict[int, list[str]] = {}  # candidate -> what its last offers left out, and why
        self.volumes = HyperstackVolumes(self.api, self._prepare, volume_type=settings.volume_type,
                                         attach_wait_s=settings.cache_attach_wait_s, poll_s=settings.poll_s,
                                         refused=self._refused)

    @functools.cached_property
    def _public_key(self) -> str:  # read when first needed: the read-only calls need no local key
        return " ".join(public_key(self.name, self.settings.ssh_key).split()[:2])

    @functools.cached_property
    def _key_name(self) -> str:
        return "actor-run-" + hashlib.sha256(self._public_key.encode()).hexdigest()[:12]

    def _refused(self, what: str, resp: httpx.Response) -> Exception:
        if is_auth_refusal(resp.status_code):
            return LaunchRefused(f"hyperstack: {what}: the key was refused: {short(resp)}", code=Code.GUARD)
        return NoAnswer(f"hyperstack: {what}: {short(resp)}")

    async def _get(self, what: str, path: str, params: dict[str, Any] | None = None) -> Any:
        resp = await self.api.call("GET", path, params=params)
        body = body_json(resp)
        if resp.status_code != 200 or (isinstance(body, dict) and body.get("status") is False):
            raise self._refused(what, resp)
        return body

    # --- offers -----------------------------------------------------------------------------------

    async def _region_images(self, region: str) -> list[str]:
        """The image names a region offers (`GET /core/images?region=`), read once per region."""
        async with self._images_lock:  # candidates ask for offers at once: one GET per region
            if region not in self._images:
                body = await self._get(f"images of {region}", "/core/images", {"region": region})
                self._images[region] = [str(i.get("name")) for group in body.get("images") or []
                                        for i in group.get("images") or [] if i.get("name")]
            return self._images[region]

    async def image_for(self, gpu: str, region: str, named: str) -> str:
        """The image a machine of `gpu` boots in `region`: `named` if the region has it (and its CUDA,
        when its name says, meets the floor), else the region's image with the newest CUDA at or
        above the floor; "" when there is none (the region is skipped)."""
        floor = cuda_floor(gpu) or (0, 0)
        images = await self._region_images(region)
        if named:
            ok = named in images and (image_cuda(named) or floor) >= floor
            return named if ok else ""
        return newest_image(((n, image_cuda(n)) for n in images), floor)

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        flavors = await self._get("flavors", "/core/flavors")
        stocks = await self._get("stocks", "/core/stocks")
        prices = {str(p.get("name")): float(p.get("value") or 0) for p in await self._get("pricebook", "/pricebook")}
        self._prices = prices
        left = {(s.get("region"), m.get("model")): str(m.get("available", "")) for s in stocks.get("stocks") or []
                for m in s.get("models") or []}
        empty = {place for place, n in left.items() if n == "0"}
        wanted = vendor_ids(candidate.gpu, VENDOR)
        count = gpu_count(candidate.gpu)
        out: list[Offer] = []
        passed: list[str] = []
        for group in flavors.get("data") or []:
            for f in group.get("flavors") or []:
                gpu, region = str(f.get("gpu") or ""), str(f.get("region_name") or group.get("region_name") or "")
                if not f.get("stock_available") or int(f.get("gpu_count") or 0) != count or (region, gpu) in empty:
                    continue
                if (wanted and gpu not in wanted) or (candidate.regions and region not in candidate.regions):
                    continue
                price = prices.get(gpu, 0.0) * count + prices.get("PublicIP", 0.0)  # the machine's
                if candidate.max_hourly_usd is not None and price > candidate.max_hourly_usd:
                    continue
                ours = gpu_class(candidate.gpu) or our_name(gpu, VENDOR)
                image = await self.image_for(ours, region, candidate.image or self.settings.image)
                if not image:  # no image this GPU can run here: skipped before any create
                    passed.append(no_image(region, ours))
                    continue
                out.append(Offer(cloud=self.name, region=region, gpu=shape(ours, count),
                                 hourly_usd=round(price, 4), candidate=index, kind=str(f["name"]),
                                 stock=left.get((region, gpu), ""), image=image))
        self._passed_over[index] = sorted(set(passed))
        out.sort(key=lambda o: (o.hourly_usd, o.region, o.kind))
        return out

    def passed_over(self, index: int) -> list[str]:
        return list(self._passed_over.get(index, []))

    # --- cache volumes (hyperstack_volumes.py) -----------------------------------------------------

    @property
    def cache_usd_per_gb_month(self) -> float:
        """The settings' price, else the price book's for the volume type (per GB-hour, hyperstack.md §6) x 730."""
        return self.settings.cache_usd_per_gb_month or round(self._prices.get(self.settings.volume_type, 0.0) * 730, 4)

    async def open_cache(self, offer: Offer, cache: CacheSpec) -> CacheVolume | None:
        return await self.volumes.open_cache(offer, cache)

    async def list_caches(self) -> list[CacheVolume]:
        return await self.volumes.list_caches()

    async def delete_cache(self, volume_id: str) -> None:
        await self.volumes.delete_cache(volume_id)

    async def attach_cache(self, offer: Offer, machine: Machine, workspace: Workspace) -> tuple[str, str]:
        return await self.volumes.attach_cache(offer, machine, workspace)

    # --- the environment and our key in it, once per region ---------------------------------------

    def _environment(self, region: str) -> str:
        return self.settings.environment.replace("{region}", region)[:50]

    async def _prepare(self, region: str) -> str:
        env = self._environment(region)
        async with self._env_lock:
            if env in self._ready_envs:
                return env
            found = await self._get("environments", "/core/environments", {"search": env, "pageSize": str(PAGE)})
            if not any(e.get("name") == env for e in found.get("environments") or []):
                resp = await self.api.call("POST", "/core/environments", json={"name": env, "region": region})
                if resp.status_code not in (200, 409):
                    raise self._refused(f"creating environment {env}", resp)
            keys = await self._get("keypairs", "/core/keypairs", {"search": self._key_name, "pageSize": str(PAGE)})
            if not any(k.get("name") == self._key_name and (k.get("environment") or {}).get("name") == env
                       for k in keys.get("keypairs") or []):
                resp = await self.api.call("POST", "/core/keypairs", json={
                    "name": self._key_name, "environment_name": env, "public_key": self._public_key})
                if resp.status_code not in (200, 409):
                    raise self._refused(f"importing keypair {self._key_name}", resp)
            self._ready_envs.add(env)
            return env

    # --- the machine ------------------------------------------------------------------------------

    async def _create(self, offer: Offer, name: str, deadline: float) -> str:
        # everything read before the POST (the environment, our key, the region's images when the offer
        # names no image: one from a ledger written before offers carried it) fails clean: nothing was made
        try:
            env = await self._prepare(offer.region)
            image = offer.image or await self.image_for(offer.gpu, offer.region, self.settings.image)
        except (NoAnswer, RateLimited) as exc:
            raise LaunchRefused(f"hyperstack: {exc}", code=Code.LAUNCH_FAILED) from exc
        if not image:
            raise LaunchRefused(f"hyperstack: {offer.region} has no image for {offer.gpu} (no create was sent)",
                                code=Code.NO_CAPACITY)
        body = {
            "name": vendor_name(name, NAME_LIMIT), "environment_name": env, "flavor_name": offer.kind,
            "image_name": image,
            "key_name": self._key_name, "count": 1,
            "assign_floating_ip": True, "enable_port_randomization": False, "labels": [NAME_LABEL + name],
        }
        try:
            resp = await self.api.call("POST", "/core/virtual-machines", json=body)
        except NotSent as exc:  # it never left: nothing can have been made
            raise LaunchRefused(f"hyperstack: the create of {name}: {exc}", code=Code.LAUNCH_FAILED) from exc
        except NoAnswer as exc:
            raise LaunchAmbiguous(f"hyperstack: the create of {name}: {exc}") from exc
        answer = body_json(resp)
        if resp.status_code == 200 and isinstance(answer, dict) and answer.get("status") is not False:
            made = answer.get("instances") or []
            if not made or made[0].get("id") is None:
                raise LaunchAmbiguous(f"hyperstack: the create of {name} was accepted without an id: {short(resp)}")
            vm_id = str(made[0]["id"])
            await self._open_ssh(vm_id)
            return vm_id
        code = classify_create(resp.status_code, answer)
        if code is None:
            raise LaunchAmbiguous(f"hyperstack: the create of {name}: {short(resp)}")
        raise LaunchRefused(f"hyperstack: the create of {name} was refused: {short(resp)}", code=code)

    async def _open_ssh(self, vm_id: str) -> None:
        """Port 22 in (hyperstack.md §8: inbound SSH is closed by default)."""
        rule = {"direction": "ingress", "protocol": "tcp", "ethertype": "IPv4", "remote_ip_prefix": "0.0.0.0/0",
                "port_range_min": self.settings.ssh_port, "port_range_max": self.settings.ssh_port,
                "virtual_machine_id": int(vm_id)}
        try:
            resp = await self.api.call("POST", f"/core/virtual-machines/{vm_id}/sg-rules", json=rule)
        except NoAnswer as exc:
            raise LaunchAmbiguous(f"hyperstack: opening SSH on VM {vm_id}: {exc}", code=Code.LAUNCH_FAILED) from exc
        if resp.status_code not in (200, 409):  # 409: the rule is there already
            raise LaunchAmbiguous(f"hyperstack: opening SSH on VM {vm_id}: {short(resp)}", code=Code.LAUNCH_FAILED)

    def _seen(self, vm: dict[str, Any]) -> Seen:
        status = str(vm.get("status", ""))
        state = VM_STATES.get(status, "pending")
        ip = str(vm.get("floating_ip") or "")
        if state == "ready" and not ip:
            state = "pending"
        labels = [str(x) for x in vm.get("labels") or []]
        full = next((x[len(NAME_LABEL):] for x in labels if x.startswith(NAME_LABEL)), "")
        flavor = vm.get("flavor") or {}
        gpu = str(flavor.get("gpu") or "")
        hourly = self._prices.get(gpu, 0.0) * int(flavor.get("gpu_count") or 1) + self._prices.get("PublicIP", 0.0)
        return Seen(
            id=str(vm.get("id", "")), name=full or str(vm.get("name") or ""), state=state, detail=status,
            address=ip, port=self.settings.ssh_port, user=self.settings.user, hourly_usd=round(hourly, 4),
            region=str((vm.get("environment") or {}).get("region") or ""), gpu=our_name(gpu, VENDOR) if gpu else "",
            created_at=_when(vm.get("created_at")),
        )

    async def _read(self, machine_id: str) -> Seen | None:
        resp = await self.api.call("GET", f"/core/virtual-machines/{machine_id}")
        if resp.status_code == 404:
            return None
        body = body_json(resp)
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"hyperstack: reading VM {machine_id}: the key was refused: {short(resp)}")
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") is False:
            raise NoAnswer(f"hyperstack: reading VM {machine_id}: {short(resp)}")
        return self._seen(body.get("instance") or {})

    async def _list(self) -> list[Seen]:
        out: list[Seen] = []
        for page in range(1, 1001):  # bounded: 200 000 VMs
            resp = await self.api.call("GET", "/core/virtual-machines", params={"page": page, "pageSize": PAGE})
            body = body_json(resp)
            if is_auth_refusal(resp.status_code):
                raise DeleteUnconfirmed(f"hyperstack: listing VMs: the key was refused: {short(resp)}")
            if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") is False:
                raise NoAnswer(f"hyperstack: listing VMs: {short(resp)}")
            vms = body.get("instances") or []
            out += [self._seen(v) for v in vms]
            if len(vms) < PAGE:
                break
        return out

    async def _delete_call(self, machine_id: str) -> None:
        await self.volumes.detach(machine_id)  # the cache's volume let go first: the next attempt's sooner
        resp = await self.api.call("DELETE", f"/core/virtual-machines/{machine_id}")
        if resp.status_code in (200, 404):  # hyperstack.md §5: 404 on delete is gone
            return
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"hyperstack: deleting VM {machine_id}: the key was refused: {short(resp)}")
        # 409 (a transitional state) or a 5xx: the read that follows says; asked again if needed
        raise NoAnswer(f"hyperstack: deleting VM {machine_id}: {short(resp)}")

    def _deadline_script(self, machine: Machine) -> str:
        return shutdown_script(machine.deadline, self.settings.shutdown_command)

    async def aclose(self) -> None:
        await self.api.aclose()


__all__ = ["CREATE_ANSWERS", "VM_STATES", "HyperstackCloud", "HyperstackSettings", "classify_create"]
