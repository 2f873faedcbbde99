"""The `vastai` cloud: Vast.ai marketplace instances (on-demand, or interruptible by bid) over its
REST API (`/api/v0/...`, the instance list at `/api/v1/instances/`).

Settings (`[clouds.vastai]`), every field optional (and those of clouds/rented.py)::

    api_url = "https://console.vast.ai"
    api_key_env = "VAST_API_KEY"
    ssh_key = "~/.ssh/id_ed25519"      # its public half is registered on the account before a create
    image = "vastai/base-image:@vastai-automatic-tag"
    disk_gb = 32                       # the instance's disk (offers must have it free)
    min_reliability = 0.98             # an offer's `reliability2` at least this
    verified = true                    # verified hosts only
    min_cuda = 0.0                     # the host's `cuda_max_good` at least this (0: the GPU class's floor, gpus.py)
    bid_margin = 0.1                   # an interruptible candidate bids the offer's min_bid and this share over it
    user = "root"                      # the login on Vast's containers

Offers come from the search `POST /api/v0/bundles/` (vastai.md §2.1) filtered for a GPU job: the
GPU class through the GPU table, one GPU, direct SSH ports, the price ceiling, reliability,
verified hosts, the disk, the host's CUDA against the class's floor; cheapest first. A candidate
with `interruptible = true` searches `type: bid` and rents by bid (`price`, capped by its
`max_bid_usd`); each offer shows the other price beside its own (`interruptible_usd`).

A create (`PUT /api/v0/asks/<offer>/`) carries our lease name as its `label`. Its answers
(vastai.md §4): `new_contract` anywhere, even in an error, is an instance that exists (a losing bid
makes one stopped and answers an error naming it: destroyed here and proven gone, then the offer
is `no_capacity`); `no_such_ask` is `no_capacity`; a refused key is `guard`; a 5xx or no answer is
ambiguous (the lease lists by label and deletes what it made: never a blind retry, §5). An
instance is ready when `actual_status` is `running` and its `ports["22/tcp"]` maps a host port
(direct SSH as root on `public_ipaddr`, §9). Right after a create `show` may answer
`{"instances": null}` (waited out for `listing_lag_s`); `exited`, `unknown` and `offline` never
recover (§3: `launch_failed`, deleted); an interruptible instance `stopped` was outbid (taken:
`preempted`). Every string is stripped (§2.4). A 429 comes without Retry-After, often as plain
text: the wait is the endpoint's documented interval (vastai-v0.yaml's 429 examples, §1).
Deletion is proven by `show` answering null and the instance gone from the v1 list. Vast keeps
no deadline of its own (§10): the machine destroys itself at its deadline with the
instance-scoped key Vast puts in its container (our key never goes there); the host watchdog and
the sweep are the other backstops (README).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec
import trio

from actor_run.protocols.clouds.gpus import min_cuda, our_name, vendor_ids
from actor_run.protocols.clouds.http import NoAnswer, NotSent, ProviderAPI, body_json, short
from actor_run.protocols.clouds.rented import RentedCloud, RentedSettings, Seen, api_key
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchAmbiguous, LaunchRefused
from actor_run.protocols.hosts.scripts import q
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # httpx (about 0.2 s of CPU) loads with the first call (http.py): none made, none loaded
    import httpx

VENDOR = "vastai"
Share = Annotated[float, msgspec.Meta(ge=0, le=1)]


class VastSettings(RentedSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    api_url: str = "https://console.vast.ai"
    api_key_env: str = "VAST_API_KEY"
    image: str = "vastai/base-image:@vastai-automatic-tag"
    disk_gb: Annotated[float, msgspec.Meta(gt=0)] = 32.0
    min_reliability: Share = 0.98
    verified: bool = True
    min_cuda: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    bid_margin: Annotated[float, msgspec.Meta(ge=0)] = 0.1
    user: str = "root"  # the login on a Vast container (vastai.md §9)
    # the vendor's CLI allows 900 s for `running` (vastai.md §3): image pulls dominate
    launch_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 900.0
    listing_lag_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0  # show answers null right after a create


# The first wait after a 429 (Vast sends no Retry-After): the document's per-endpoint thresholds
# (vastai-v0.yaml 429 examples: create 4.5, destroy 3.0, show 2.0, manage 1.0, v1 list 1.0, ssh
# keys 1.0, change bid 5.5; vastai.md §1), read as seconds (vast-ai/docs#61). Search documents
# none: 1.0. (method, path start, seconds), the first match wins.
PACES: list[tuple[str, str, float]] = [
    ("PUT", "/api/v0/asks/", 4.5),
    ("PUT", "/api/v0/instances/bid_price/", 5.5),
    ("DELETE", "/api/v0/instances/", 3.0),
    ("GET", "/api/v0/instances/", 2.0),
    ("PUT", "/api/v0/instances/", 1.0),
    ("GET", "/api/v1/instances/", 1.0),
    ("", "/api/v0/ssh/", 1.0),
]


def pace(method: str, path: str) -> float:
    """Seconds to wait after a 429 on `method path` before sending it again (PACES)."""
    for want, start, seconds in PACES:
        if (not want or want == method) and path.startswith(start):
            return seconds
    return 1.0


def clean(value: Any) -> Any:
    """`value` with every string in it stripped (vastai.md §2.4: stray whitespace, even newlines)."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def error_words(body: Any, text: str) -> str:
    """What an error answer says, lower-cased: `error` and `msg` (or `message`) of a JSON body, else
    the raw text (the envelope is not uniform, vastai.md §1)."""
    if isinstance(body, dict):
        return " ".join(str(body.get(k) or "") for k in ("error", "msg", "message", "detail")).lower()
    return text.lower()


def is_bad_key(status: int, words: str) -> bool:
    """401/403, or a 404 whose body says auth_error (vastai.md §1: a wrong key observed as 404)."""
    return status == 401 or (status == 403 and "not your own" not in words) or (
        status == 404 and ("auth_error" in words or "invalid user key" in words))


# What a create's refusal means when no `new_contract` rides in it (vastai.md §4). (status or 0 for
# any, words in error/msg, code, the contract line)
CREATE_ANSWERS: list[tuple[int, str, Code, str]] = [
    (0, "no_such_ask", Code.NO_CAPACITY, "vastai.md §4: 404/410 no_such_ask, whatever the status: the offer is taken"),
    (400, "", Code.LAUNCH_FAILED, "vastai.md §4: 400 invalid_args / invalid_price / no_ssh_key_for_vm"),
    (403, "not your own", Code.LAUNCH_FAILED, "vastai.md §4: 403 renting own machine"),
    (404, "", Code.NO_CAPACITY, "vastai-v0.yaml createInstance 404: offer not found or not available"),
    (410, "", Code.NO_CAPACITY, "vastai-v0.yaml createInstance 410: offer no longer available"),
]


def classify_create(status: int, words: str) -> Code | None:
    """The failure a create's refusal (without `new_contract`) means, or None when it proves nothing."""
    if is_bad_key(status, words):
        return Code.GUARD
    for want, match, code, _ in CREATE_ANSWERS:
        if (not want or status == want) and (not match or match in words):
            return code
    return None


DEAD = ("exited", "unknown", "offline")  # vastai-v0.yaml info: "will never reach running -- destroy and retry"


def seen_instance(inst: dict[str, Any], user: str = "root") -> Seen:
    """One instance (a show or a v1 list row, strings stripped) in our words."""
    actual = str(inst.get("actual_status") or "")
    intended = str(inst.get("intended_status") or "")
    cur = str(inst.get("cur_state") or "")
    msg = str(inst.get("status_msg") or "")
    detail = " ".join(w for w in (actual or "provisioning", msg) if w)[:200]
    state: Literal["pending", "ready", "failed", "gone"] = "pending"
    taken = False
    if cur == "unloaded" or actual in ("destroyed", "terminated") or intended in ("destroyed", "terminated"):
        state = "gone"
    elif actual in DEAD or (actual == "created" and "oci runtime" in msg.lower()):
        state, taken = "failed", True
    elif actual == "stopped" or (intended == "stopped" and cur == "stopped"):
        # outbid (vastai.md §6: cur_state == intended_status == next_state == stopped), or an
        # on-demand made stopped: either way it does not run for us
        state, taken = "failed", True
        detail = f"stopped{' (outbid)' if inst.get('is_bid') else ''}"
    address, port = str(inst.get("public_ipaddr") or ""), 0
    mapped = (inst.get("ports") or {}).get("22/tcp") if isinstance(inst.get("ports"), dict) else None
    if mapped:
        try:
            port = int(mapped[0]["HostPort"])
        except (KeyError, IndexError, TypeError, ValueError):
            port = 0
    if state == "pending" and actual == "running" and address and port:
        state = "ready"
    gpu = str(inst.get("gpu_name") or "")
    return Seen(
        id=str(inst.get("id", "")), name=str(inst.get("label") or ""), state=state, detail=detail,
        address=address, port=port or 22, user=user, hourly_usd=float(inst.get("dph_total") or 0.0),
        region=str(inst.get("geolocation") or ""), gpu=our_name(gpu, VENDOR) if gpu else "",
        created_at=float(inst.get("start_date") or 0.0), taken=taken,
    )


# At the deadline the container destroys its own instance with the instance-scoped key Vast puts
# in PID 1's environment (vastai.md §10: CONTAINER_ID, CONTAINER_API_KEY; SSH sessions do not
# inherit them); if that key may not destroy, it stops the instance (GPU billing ends; the sweep
# destroys it).
_SELF_DESTROY = r"""#!/bin/sh
# actor-run: this instance destroys itself at its deadline, with the instance-scoped key Vast gives it
now=$(date +%s); [ {deadline} -gt "$now" ] && sleep $(({deadline} - now))
env1=$(tr '\0' '\n' </proc/1/environ 2>/dev/null)
id=${{CONTAINER_ID:-$(printf '%s\n' "$env1" | sed -n 's/^CONTAINER_ID=//p')}}
key=${{CONTAINER_API_KEY:-$(printf '%s\n' "$env1" | sed -n 's/^CONTAINER_API_KEY=//p')}}
[ -n "$id" ] || id={machine_id}
i=0
while [ $i -lt 30 ]; do
  code=$(printf 'Authorization: Bearer %s\n' "$key" |
    curl -s -o /dev/null -w '%{{http_code}}' -m 30 -H @- -H 'Content-Type: application/json' -d '{{}}' \
      -X DELETE {url}/api/v0/instances/$id/)
  case "$code" in 2??) exit 0;; esac
  code=$(printf 'Authorization: Bearer %s\n' "$key" |
    curl -s -o /dev/null -w '%{{http_code}}' -m 30 -H @- -H 'Content-Type: application/json' \
      -d '{{"state": "stopped"}}' -X PUT {url}/api/v0/instances/$id/)
  case "$code" in 2??) exit 0;; esac
  i=$((i + 1)); sleep 20
done
"""


class VastCloud(RentedCloud):
    name = VENDOR
    settings: VastSettings

    def __init__(self, settings: VastSettings, state_dir: Path, *, transport: httpx.AsyncBaseTransport | None = None
                 ) -> None:
        super().__init__(settings, state_dir)
        key = api_key(self.name, settings.api_key_env)
        self.api = ProviderAPI(self.name, settings.api_url, {"Authorization": f"Bearer {key}"},
                               timeout_s=settings.timeout_s, transport=transport, pace=pace)
        self._key_done = False
        self._key_lock = trio.Lock()

    def _not_answered(self, what: str, resp: httpx.Response) -> Exception:
        words = error_words(body_json(resp), resp.text)
        if is_bad_key(resp.status_code, words):
            return LaunchRefused(f"vastai: {what}: the key was refused: {short(resp)}", code=Code.GUARD)
        return NoAnswer(f"vastai: {what}: {short(resp)}")

    # --- offers -----------------------------------------------------------------------------------

    def search_body(self, candidate: CandidateSpec) -> dict[str, Any]:
        """The search's filters for `candidate` (vastai.md §2.1)."""
        s = self.settings
        body: dict[str, Any] = {
            "verified": {"eq": s.verified}, "rentable": {"eq": True}, "rented": {"eq": False},
            "num_gpus": {"in": [1]}, "direct_port_count": {"gte": 1}, "disk_space": {"gte": s.disk_gb},
            "reliability2": {"gte": s.min_reliability},
            # the CLI's word (vastai.md §12 #6: the document's enum says "ondemand", its own example
            # and the CLI send "on-demand")
            "type": "bid" if candidate.interruptible else "on-demand",
            "order": [["dph_total", "asc"], ["reliability2", "desc"]], "allocated_storage": s.disk_gb, "limit": 64,
        }
        names = vendor_ids(candidate.gpu, VENDOR)
        if names:
            body["gpu_name"] = {"in": list(names)}
        floor = s.min_cuda or min_cuda(candidate.gpu)
        if floor:
            body["cuda_max_good"] = {"gte": floor}
        if candidate.max_hourly_usd is not None:
            body["dph_total"] = {"lte": candidate.max_hourly_usd}
        if candidate.regions:  # two-letter country codes (vastai.md §2.1 geolocation)
            body["geolocation"] = {"in": list(candidate.regions)}
        return body

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        resp = await self.api.call("POST", "/api/v0/bundles/", json=self.search_body(candidate))
        if resp.status_code != 200:
            raise self._not_answered("searching offers", resp)
        out = []
        for raw in (body_json(resp) or {}).get("offers") or []:
            o = clean(raw)
            price = float(o.get("dph_total") or 0.0)
            min_bid = float(o.get("min_bid") or 0.0)
            storage = max(0.0, price - float(o.get("dph_base") or price))
            ours = candidate.gpu or our_name(str(o.get("gpu_name", "")), VENDOR)
            common = Offer(cloud=self.name, region=str(o.get("geolocation") or ""), gpu=ours, candidate=index,
                           kind=str(o.get("id", "")), stock="1")
            if candidate.interruptible:
                bid = min_bid * (1 + self.settings.bid_margin)
                if candidate.max_bid_usd is not None:
                    if candidate.max_bid_usd < min_bid:
                        continue  # the host takes no bid this low
                    bid = min(bid, candidate.max_bid_usd)
                out.append(msgspec.structs.replace(common, hourly_usd=round(bid, 6), interruptible=True,
                                                   interruptible_usd=round(bid + storage, 6)))
            else:
                out.append(msgspec.structs.replace(common, hourly_usd=price,
                                                   interruptible_usd=round(min_bid + storage, 6)))
        out.sort(key=lambda o: (o.hourly_usd, o.region, o.kind))
        return out

    # --- the machine ------------------------------------------------------------------------------

    async def _register_key(self) -> None:
        """Our public key on the account, before any create (vastai.md §9: account keys reach only
        instances made after them)."""
        async with self._key_lock:
            if self._key_done:
                return
            mine = " ".join(self._public_key.split()[:2])
            resp = await self.api.call("GET", "/api/v0/ssh/")
            if resp.status_code != 200:
                raise self._not_answered("listing ssh keys", resp)
            have = {" ".join(str(k.get("key") or k.get("public_key") or "").split()[:2])
                    for k in body_json(resp) or [] if isinstance(k, dict)}
            if mine not in have:
                resp = await self.api.call("POST", "/api/v0/ssh/", json={"ssh_key": mine})
                if resp.status_code != 200:
                    raise self._not_answered("registering the ssh key", resp)
            self._key_done = True

    async def _create(self, offer: Offer, name: str, deadline: float) -> str:
        s = self.settings
        try:
            await self._register_key()
        except NoAnswer as exc:  # nothing was created yet: a clean refusal
            raise LaunchRefused(f"vastai: {exc}", code=Code.LAUNCH_FAILED) from exc
        body: dict[str, Any] = {"image": s.image, "label": name, "disk": s.disk_gb, "runtype": "ssh_direct",
                                "target_state": "running"}
        if offer.interruptible:
            body["price"] = offer.hourly_usd
        else:
            body["cancel_unavail"] = True  # an on-demand that cannot start is refused, not made stopped
        try:
            resp = await self.api.call("PUT", f"/api/v0/asks/{offer.kind}/", json=body)
        except NotSent as exc:
            raise LaunchRefused(f"vastai: the create of {name}: {exc}", code=Code.LAUNCH_FAILED) from exc
        except NoAnswer as exc:
            raise LaunchAmbiguous(f"vastai: the create of {name}: {exc}") from exc
        answer = body_json(resp)
        made = answer.get("new_contract") if isinstance(answer, dict) else None
        if resp.status_code == 200 and isinstance(answer, dict) and answer.get("success") and made:
            return str(made)
        if made:  # an error that names an instance (a losing bid made it stopped): it exists until destroyed
            await self._destroy_refused(name, str(made), resp)
        code = classify_create(resp.status_code, error_words(answer, resp.text))
        if code is None:
            raise LaunchAmbiguous(f"vastai: the create of {name}: {short(resp)}")
        raise LaunchRefused(f"vastai: the create of {name} was refused: {short(resp)}", code=code)

    async def _destroy_refused(self, name: str, machine_id: str, resp: httpx.Response) -> None:
        """Destroy the instance a refused create made and prove it gone: then the refusal is clean
        (`no_capacity`: the bid lost); if it cannot be proven, ambiguous (the lease deletes by name)."""
        try:
            await self._delete_one(name, machine_id, trio.current_time() + self.settings.delete_wait_s)
        except (DeleteUnconfirmed, NoAnswer) as exc:
            raise LaunchAmbiguous(f"vastai: the create of {name} made {machine_id} and was refused "
                                  f"({short(resp)}); its destroy is unconfirmed: {exc}") from exc
        raise LaunchRefused(f"vastai: the create of {name} made {machine_id}, stopped, and was refused "
                            f"({short(resp)}): destroyed", code=Code.NO_CAPACITY)

    async def _read(self, machine_id: str) -> Seen | None:
        resp = await self.api.call("GET", f"/api/v0/instances/{machine_id}/")
        words = error_words(body_json(resp), resp.text) if resp.status_code != 200 else ""
        if is_bad_key(resp.status_code, words):
            raise DeleteUnconfirmed(f"vastai: reading {machine_id}: the key was refused: {short(resp)}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise NoAnswer(f"vastai: reading {machine_id}: {short(resp)}")
        inst = (body_json(resp) or {}).get("instances")
        if not isinstance(inst, dict):
            return None  # destroyed, or just created and not shown yet (the launch waits listing_lag_s)
        return seen_instance(clean(inst), self.settings.user)

    async def _list(self, filters: dict[str, Any] | None = None) -> list[Seen]:
        """Every instance of the account (or those `filters` select, §8), page by page through the v1
        list (the v0 list answers 410: an error, never an empty list, vastai.md §5)."""
        out: list[Seen] = []
        token: str | None = None
        for _ in range(10_000):  # bounded: 25 a page
            params = {"limit": 25, "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                      "select_filters": json.dumps(filters or {})}
            if token:
                params["after_token"] = token
            resp = await self.api.call("GET", "/api/v1/instances/", params=params)
            words = error_words(body_json(resp), resp.text) if resp.status_code != 200 else ""
            if is_bad_key(resp.status_code, words):
                raise DeleteUnconfirmed(f"vastai: listing instances: the key was refused: {short(resp)}")
            body = body_json(resp)
            if resp.status_code != 200 or not isinstance(body, dict) or not isinstance(body.get("instances"), list):
                raise NoAnswer(f"vastai: listing instances: {short(resp)}")
            out += [seen_instance(clean(i), self.settings.user) for i in body["instances"] if isinstance(i, dict)]
            token = body.get("next_token")
            if not token:
                return out
        raise NoAnswer("vastai: listing instances: the pages never ended")

    async def _is_gone(self, machine_id: str) -> bool:
        """Gone when `show` answers null (or 404) and the v1 list has it no more (vastai.md §3)."""
        if not await super()._is_gone(machine_id):
            return False
        listed = await self._list({"id": {"eq": int(machine_id)}})
        return all(m.id != machine_id or m.state == "gone" for m in listed)

    async def _delete_call(self, machine_id: str) -> None:
        resp = await self.api.call("DELETE", f"/api/v0/instances/{machine_id}/", json={})
        words = error_words(body_json(resp), resp.text) if resp.status_code != 200 else ""
        if is_bad_key(resp.status_code, words):
            raise DeleteUnconfirmed(f"vastai: destroying {machine_id}: the key was refused: {short(resp)}")
        if resp.status_code in (200, 404):  # 404 no_such_instance: already gone (vastai.md §4)
            return
        raise NoAnswer(f"vastai: destroying {machine_id}: {short(resp)}")

    def _deadline_script(self, machine: Machine) -> str:
        return _SELF_DESTROY.format(deadline=int(machine.deadline), url=q(self.settings.api_url.rstrip("/")),
                                    machine_id=q(machine.id))

    async def aclose(self) -> None:
        await self.api.aclose()


__all__ = ["CREATE_ANSWERS", "PACES", "VastCloud", "VastSettings", "classify_create", "pace", "seen_instance"]
