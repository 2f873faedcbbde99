"""The `shadeform` cloud: GPU instances on many underlying clouds through Shadeform's API v1
(`https://api.shadeform.ai/v1`), with a deadline Shadeform itself enforces (`auto_delete`).

Settings (`[clouds.shadeform]`), every field optional (and those of clouds/rented.py)::

    api_url = "https://api.shadeform.ai/v1"
    api_key_env = "SHADEFORM_API_KEY"  # sent as the X-API-KEY header
    ssh_key = "~/.ssh/id_ed25519"      # its public half is registered once as actor-run-<hash>
    clouds = []                        # Shadeform's underlying clouds to rent from (empty: all)
    os = ""                            # one of the type's os_options (empty: Shadeform's default)
    shade_cloud = true                 # Shadeform's own accounts (spot needs it)
    launch_timeout_s = 2700            # some underlying clouds take 15-40 min (raise policy.setup_grace_s too)
    shutdown_command = "sudo -n shutdown -h now"   # run on the machine at its deadline, behind auto_delete

Offers come from `GET /instances/types?available=true&num_gpus=1`: one per available region of each
instance type our GPU name maps to (`shade_instance_type`, shadeform.md §2.1), each across the
underlying cloud that sells it (`kind` = `<cloud>/<type>`), at the type's `hourly_price` (cents)
for on-demand, or the region's spot entry (`hourly_price`, a dollar string) for an
`interruptible = true` candidate; each shows the other price beside its own. A create carries our
name, our key, the tags `actor-run` and `actor-run-name=<name>`, and `auto_delete.date_threshold`
= the machine's deadline (RFC 3339), and `spend_threshold` = the attempt's reserved dollars where
a budget caps the batch: Shadeform deletes it then even if every process of ours is gone (§7).
Statuses: `creating` -> `pending_provider` -> `pending` -> `active` (ready once `ip` and `ssh_port`
are set) or `error` (`launch_failed`); `deleting` -> `deleted` (deletion is proven by
`deleted` or a 404); a spot instance reclaimed (`deleting`, `status_details` `preempted`, §6) is
taken: the attempt is `preempted`. Shadeform documents no error shape (§4): 401/403 are `guard`,
400/422 created nothing (`launch_failed`); every other answer to a create is ambiguous, and the
lease finds what it made by name and tag before another launch (§5).
"""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import trio

from actor_run.protocols.clouds.gpus import our_name, vendor_ids
from actor_run.protocols.clouds.http import NoAnswer, NotSent, ProviderAPI, body_json, is_auth_refusal, short
from actor_run.protocols.clouds.rented import RentedCloud, RentedSettings, Seen, api_key, shutdown_script
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchAmbiguous, LaunchRefused
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # httpx (about 0.2 s of CPU) loads with the first call (http.py): none made, none loaded
    import httpx

VENDOR = "shadeform"
OUR_TAG = "actor-run"
NAME_TAG = "actor-run-name="  # + the full name: what reconciles a create by name and tag


class ShadeformSettings(RentedSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    api_url: str = "https://api.shadeform.ai/v1"
    api_key_env: str = "SHADEFORM_API_KEY"
    clouds: list[str] = msgspec.field(default_factory=list)
    os: str = ""
    shade_cloud: bool = True
    # "1 - 15 minutes on average ... some taking upwards of 30-40 minutes" (shadeform.md §3)
    launch_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 2700.0
    poll_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0  # SkyPilot polls every 10 s, Shadeform's terraform 15 s
    listing_lag_s: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    # a second line behind auto_delete (whose latency is undocumented, §7): the OS stops at the deadline
    shutdown_command: str = "sudo -n shutdown -h now"


# status -> ours (shadeform-v1.yaml Status; shadeform.md §3). `deleting` is not gone yet: billing
# has stopped, and the proof of deletion is `deleted` or a 404.
INSTANCE_STATES: dict[str, Literal["pending", "ready", "failed", "gone"]] = {
    "creating": "pending", "pending_provider": "pending", "pending": "pending", "active": "ready",
    "error": "failed", "deleting": "failed", "deleted": "gone",
}

# What a create's answer proves (shadeform.md §4: only 401/403 are documented; the working rule
# until probed). (status, code, the contract line)
CREATE_ANSWERS: list[tuple[int, Code, str]] = [
    (401, Code.GUARD, 'shadeform.md §1: 401 {"message": "Invalid API key"}'),
    (403, Code.GUARD, "shadeform.md §1: 403 account mismatch"),
    (400, Code.LAUNCH_FAILED, "shadeform.md §4: schema 400 creates nothing (working rule)"),
    (422, Code.LAUNCH_FAILED, "shadeform.md §4: schema 422 creates nothing (working rule)"),
]
# a 400/422 (nothing made) whose message speaks of stock: the place has none now, walk on (the
# wording is not documented, shadeform.md §4: these words are what the refusal must contain)
NO_STOCK_WORDS = ("capacity", "not available", "unavailable", "out of stock", "sold out")


def classify_create(status: int, message: str = "") -> Code | None:
    """The failure a create's refusal means, or None when it proves nothing (ambiguous)."""
    for want, code, _ in CREATE_ANSWERS:
        if status == want:
            if code is Code.LAUNCH_FAILED and any(w in message.lower() for w in NO_STOCK_WORDS):
                return Code.NO_CAPACITY
            return code
    return None


def message(resp: httpx.Response) -> str:
    """What an error says: `message`, then `error` (the vendor CLI's order, shadeform.md §4), else the text."""
    body = body_json(resp)
    if isinstance(body, dict):
        return str(body.get("message") or body.get("error") or "")
    return resp.text


def rfc3339(when: float) -> str:
    """Unix time as Shadeform's date strings (`2006-01-02T15:04:05-07:00`), in UTC, whole seconds."""
    return datetime.datetime.fromtimestamp(int(when), tz=datetime.UTC).isoformat()


def _when(value: Any) -> float:
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def seen_instance(inst: dict[str, Any]) -> Seen:
    """One instance in our words; its name only when it carries our name tag (never adopt a
    machine of someone else's that happens to share a name)."""
    status = str(inst.get("status") or "")
    details = str(inst.get("status_details") or "")
    state = INSTANCE_STATES.get(status, "pending")
    ip, port = str(inst.get("ip") or "").strip(), int(inst.get("ssh_port") or 0)
    if state == "ready" and not (ip and port):
        state = "pending"
    tags = [str(t) for t in inst.get("tags") or []]
    name = str(inst.get("name") or "")
    if f"{NAME_TAG}{name}" not in tags:
        name = ""
    terms = inst.get("rental_terms") or {}
    try:
        hourly = float(terms.get("hourly_price") or 0) or float(inst.get("hourly_price") or 0) / 100.0
    except (TypeError, ValueError):
        hourly = 0.0
    gpu = str((inst.get("configuration") or {}).get("gpu_type") or inst.get("shade_instance_type") or "")
    return Seen(
        id=str(inst.get("id", "")), name=name, state=state, detail=" ".join(w for w in (status, details) if w),
        address=ip, port=port or 22, user=str(inst.get("ssh_user") or "shadeform"), hourly_usd=hourly,
        region=str(inst.get("region") or ""), gpu=our_name(gpu, VENDOR) if gpu else "",
        created_at=_when(inst.get("created_at")), taken=status == "deleting" or details == "preempted",
    )


class ShadeformCloud(RentedCloud):
    name = VENDOR
    settings: ShadeformSettings

    def __init__(self, settings: ShadeformSettings, state_dir: Path, *,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(settings, state_dir)
        key = api_key(self.name, settings.api_key_env)
        self.api = ProviderAPI(self.name, settings.api_url, {"X-API-KEY": key}, timeout_s=settings.timeout_s,
                               transport=transport)
        self._key_id = ""
        self._key_lock = trio.Lock()

    def _not_answered(self, what: str, resp: httpx.Response) -> Exception:
        if is_auth_refusal(resp.status_code):
            return LaunchRefused(f"shadeform: {what}: the key was refused: {short(resp)}", code=Code.GUARD)
        return NoAnswer(f"shadeform: {what}: {short(resp)}")

    # --- offers -----------------------------------------------------------------------------------

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        resp = await self.api.call("GET", "/instances/types", params={"available": "true", "num_gpus": "1"})
        if resp.status_code != 200:
            raise self._not_answered("instance types", resp)
        wanted = vendor_ids(candidate.gpu, VENDOR)
        out: list[Offer] = []
        for itype in (body_json(resp) or {}).get("instance_types") or []:
            kind = str(itype.get("shade_instance_type") or "")
            cloud = str(itype.get("cloud") or "")
            if wanted and kind not in wanted:
                continue
            if self.settings.clouds and cloud not in self.settings.clouds:
                continue
            on_demand = float(itype.get("hourly_price") or 0) / 100.0  # integer cents (§2.1)
            spot: dict[str, float] = {}
            for a in itype.get("availability") or []:
                if a.get("rental_type") == "spot" and a.get("available"):
                    try:
                        spot[str(a["region"])] = float(a.get("hourly_price") or 0)  # a dollar string (§2.1)
                    except (TypeError, ValueError):
                        continue
            for a in itype.get("availability") or []:
                region = str(a.get("region") or "")
                if not a.get("available") or (candidate.regions and region not in candidate.regions):
                    continue
                ours = candidate.gpu or our_name(kind, VENDOR)
                common = Offer(cloud=self.name, region=region, gpu=ours, candidate=index, kind=f"{cloud}/{kind}",
                               stock="available")
                if candidate.interruptible:
                    if a.get("rental_type") != "spot" or not spot.get(region):
                        continue
                    price = spot[region]
                    if candidate.max_hourly_usd is not None and price > candidate.max_hourly_usd:
                        continue
                    out.append(msgspec.structs.replace(common, hourly_usd=price, interruptible=True,
                                                       interruptible_usd=price))
                elif a.get("rental_type", "on_demand") == "on_demand":
                    if candidate.max_hourly_usd is not None and on_demand > candidate.max_hourly_usd:
                        continue
                    out.append(msgspec.structs.replace(common, hourly_usd=on_demand,
                                                       interruptible_usd=spot.get(region, 0.0)))
        out.sort(key=lambda o: (o.hourly_usd, o.kind, o.region))
        return out

    # --- the machine ------------------------------------------------------------------------------

    async def _ssh_key_id(self) -> str:
        """The id of an ssh key holding our public key: found, or registered once."""
        async with self._key_lock:
            if self._key_id:
                return self._key_id
            mine = " ".join(self._public_key.split()[:2])
            resp = await self.api.call("GET", "/sshkeys")
            if resp.status_code != 200:
                raise self._not_answered("ssh keys", resp)
            for k in (body_json(resp) or {}).get("ssh_keys") or []:
                if " ".join(str(k.get("public_key", "")).split()[:2]) == mine:
                    self._key_id = str(k["id"])
                    return self._key_id
            name = "actor-run-" + hashlib.sha256(mine.encode()).hexdigest()[:12]
            resp = await self.api.call("POST", "/sshkeys/add", json={"name": name, "public_key": mine})
            if resp.status_code != 200 or not (body_json(resp) or {}).get("id"):
                raise self._not_answered("registering the ssh key", resp)
            self._key_id = str(body_json(resp)["id"])
            return self._key_id

    def create_body(self, offer: Offer, name: str, deadline: float, key_id: str) -> dict[str, Any]:
        cloud, _, kind = offer.kind.partition("/")
        body: dict[str, Any] = {
            "cloud": cloud, "region": offer.region, "shade_instance_type": kind or vendor_ids(offer.gpu, VENDOR)[0],
            "shade_cloud": self.settings.shade_cloud, "name": name, "ssh_key_id": key_id,
            "tags": [OUR_TAG, f"{NAME_TAG}{name}"],
            # the provider's own deadline: it deletes the machine then, whatever became of us (§7)
            "auto_delete": {"date_threshold": rfc3339(deadline)},
            "rental_type": "spot" if offer.interruptible else "on_demand",
        }
        if offer.spend_cap_usd > 0:  # the attempt's reserved dollars, where a budget caps the batch
            body["auto_delete"]["spend_threshold"] = f"{offer.spend_cap_usd:.2f}"
        if self.settings.os:
            body["os"] = self.settings.os
        return body

    async def _create(self, offer: Offer, name: str, deadline: float) -> str:
        try:
            key_id = await self._ssh_key_id()
        except NoAnswer as exc:  # nothing was created yet: a clean refusal
            raise LaunchRefused(f"shadeform: {exc}", code=Code.LAUNCH_FAILED) from exc
        try:
            body = self.create_body(offer, name, deadline, key_id)
            resp = await self.api.call("POST", "/instances/create", json=body)
        except NotSent as exc:
            raise LaunchRefused(f"shadeform: the create of {name}: {exc}", code=Code.LAUNCH_FAILED) from exc
        except NoAnswer as exc:
            raise LaunchAmbiguous(f"shadeform: the create of {name}: {exc}") from exc
        if resp.status_code == 200:
            made = (body_json(resp) or {}).get("id") if isinstance(body_json(resp), dict) else None
            if made:
                return str(made)
            raise LaunchAmbiguous(f"shadeform: the create of {name} was accepted without an id: {short(resp)}")
        code = classify_create(resp.status_code, message(resp))
        if code is None:  # undocumented (a capacity error? a 5xx?): it may have made one
            raise LaunchAmbiguous(f"shadeform: the create of {name}: {short(resp)}")
        raise LaunchRefused(f"shadeform: the create of {name} was refused: {short(resp)}", code=code)

    async def _read(self, machine_id: str) -> Seen | None:
        resp = await self.api.call("GET", f"/instances/{machine_id}/info")
        if resp.status_code == 404:
            return None
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"shadeform: reading {machine_id}: the key was refused: {short(resp)}")
        if resp.status_code != 200 or not isinstance(body_json(resp), dict):
            raise NoAnswer(f"shadeform: reading {machine_id}: {short(resp)}")
        return seen_instance(body_json(resp))

    async def _list(self) -> list[Seen]:
        resp = await self.api.call("GET", "/instances")
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"shadeform: listing instances: the key was refused: {short(resp)}")
        body = body_json(resp)
        if resp.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("instances"), list):
            raise NoAnswer(f"shadeform: listing instances: {short(resp)}")
        return [seen_instance(i) for i in body["instances"] if isinstance(i, dict)]

    async def _delete_call(self, machine_id: str) -> None:
        resp = await self.api.call("POST", f"/instances/{machine_id}/delete")
        if resp.status_code in (200, 404):
            return
        if is_auth_refusal(resp.status_code):
            raise DeleteUnconfirmed(f"shadeform: deleting {machine_id}: the key was refused: {short(resp)}")
        raise NoAnswer(f"shadeform: deleting {machine_id}: {short(resp)}")

    def _deadline_script(self, machine: Machine) -> str:
        return shutdown_script(machine.deadline, self.settings.shutdown_command)

    async def aclose(self) -> None:
        await self.api.aclose()


__all__ = ["CREATE_ANSWERS", "INSTANCE_STATES", "ShadeformCloud", "ShadeformSettings", "classify_create",
           "rfc3339", "seen_instance"]
