"""Hyperstack block volumes as a candidate's cache (hyperstack.md §2: `/core/volumes`, the VM's
`attach-volumes` / `detach-volumes`), for hyperstack.py.

- One volume per cache and region, named `ar-cache-<name>-<region>` (Hyperstack's volume names are
  unique across the account, not per region: a bare name could live in one region only), found with
  `GET /core/volumes` or made with `POST /core/volumes` in the region's environment before the
  create. Leases that start together in a region find or make it one at a time (a lock per name),
  and the volume is remembered: one is made, and every lease has it. A create answered 409 (another
  controller made it a moment ago) is looked up again and used. A region that refuses one (a 4xx)
  starts cold; a volume of that name in another region (moved, or made by hand) is not used: a cold
  start.
- A block volume is attached to a running VM (`POST .../attach-volumes`), never at the create: the
  attachment reads `ATTACHING` for a while before `ATTACHED` and its `device` (a /dev/disk/by-id/...
  path). A volume still attached to a VM that is going (the last attempt's, deleted a moment ago)
  is waited for, up to `cache_attach_wait_s`; one attached to a VM that runs (another controller's
  job in the same region: a volume attaches to one machine at a time) is a cold start at once.
- On the machine, the device is formatted only when blank (`blkid` exits 2: no signature) and
  mounted at the cache's path (`mount_script`), owned by the login user; a mounted one is left as it
  is. Its bytes stay on the volume: the VM's delete detaches it (we ask `detach-volumes` first), and
  the next attempt, or the next run, mounts the same file system.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from actor_run.protocols.clouds.http import NoAnswer, ProviderAPI, RateLimited, body_json, short
from actor_run.protocols.hosts import scripts
from actor_run.protocols.hosts.workspace import ShellWorkspace, Workspace
from actor_run.protocols.messages import CACHE_PREFIX, CacheSpec, CacheVolume, Machine, Offer

if TYPE_CHECKING:
    import httpx

PAGE = 200
DEVICE = re.compile(r"/[A-Za-z0-9_./:+-]+")  # what the API may name as a device: a path, nothing a shell reads
# a VM whose attachment is on its way out (a SHUTOFF one keeps its volume: no wait for it, a cold start)
GOING = {"DELETING", "DELETED", "TERMINATED"}


def volume_name(cache: CacheSpec, region: str) -> str:
    """The volume's name at Hyperstack: the cache's, then the region (names are account-wide)."""
    return f"{cache.volume_name}-{region.lower()}"[:50]


def mount_script(device: str, path: str, wait_s: int = 60) -> str:
    """POSIX sh run on the machine: wait for `device` (the guest may see it after the API says
    attached), format it ext4 only when it is blank, mount it at `path`, and hand the mount to the
    login user. Exits 0 when the path is (or already was) the volume's mount. Blank is a device whose
    first block reads and on which `blkid -p` (the device itself, not blkid's cache) finds nothing
    (exit 2): blkid says 2 for a device it cannot read too, and a cache's bytes must never be
    formatted away for a read that failed once (exit 5 then: a cold start)."""
    d, p = scripts.q(device), scripts.q(path)
    return (
        'S=""; [ "$(id -u)" = 0 ] || S="sudo -n"\n'
        f"i=0; while [ ! -e {d} ]; do i=$((i + 1))\n"
        f'  [ "$i" -gt {int(wait_s)} ] && {{ echo "no device {device} after {int(wait_s)} s" >&2; exit 3; }}\n'
        "  sleep 1\ndone\n"
        f"$S mountpoint -q {p} 2>/dev/null && exit 0\n"
        f"$S dd if={d} of=/dev/null bs=4096 count=1 2>/dev/null ||"
        f' {{ echo "{device} cannot be read" >&2; exit 5; }}\n'
        f"$S blkid -p {d} >/dev/null 2>&1; found=$?\n"
        'if [ "$found" = 2 ]; then\n'
        f'  $S mkfs.ext4 -q -L ar-cache {d} || {{ echo "mkfs.ext4 {device} failed" >&2; exit 4; }}\n'
        'elif [ "$found" != 0 ]; then\n'
        f'  echo "blkid {device} failed ($found)" >&2; exit 5\n'
        "fi\n"
        f"$S mkdir -p {p} && $S mount {d} {p} && $S chown \"$(id -u):$(id -g)\" {p} || exit 6\n"
    )


class HyperstackVolumes:
    """The cache volumes of one Hyperstack cloud. `environment(region)` answers the region's
    environment (made if missing); every call is a trio coroutine on the reactor."""

    def __init__(self, api: ProviderAPI, environment: Callable[[str], Awaitable[str]], *, volume_type: str,
                 attach_wait_s: float, poll_s: float, refused: Callable[[str, httpx.Response], Exception]) -> None:
        self.api, self.environment, self.volume_type = api, environment, volume_type
        self.attach_wait_s, self.poll_s, self._refused = attach_wait_s, poll_s, refused
        self.attached: dict[str, int] = {}  # VM id -> the cache volume attached to it by this process
        self._open_locks: dict[str, trio.Lock] = {}  # volume name -> the lock its find-or-make runs under
        self._opened: dict[str, CacheVolume] = {}  # volume name -> the volume found or made (the reactor's)

    async def _volumes(self, search: str = "") -> list[dict[str, Any]]:
        params = {"pageSize": str(PAGE), **({"search": search} if search else {})}
        resp = await self.api.call("GET", "/core/volumes", params=params)
        body = body_json(resp)
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") is False:
            raise self._refused("volumes", resp)
        return [v for v in body.get("volumes") or [] if isinstance(v, dict)]

    def _cache(self, v: dict[str, Any], name: str, path: str = "", created: bool = False) -> CacheVolume:
        return CacheVolume(cloud="hyperstack", id=str(v.get("id", "")), name=name,
                           region=str((v.get("environment") or {}).get("region") or ""),
                           size_gb=int(v.get("size") or 0), path=path, created=created)

    async def list_caches(self) -> list[CacheVolume]:
        """Every volume of ours (ar-cache-<name>-<region>), as the cache it holds (`name`: ar-cache-<name>)."""
        out = []
        for v in await self._volumes(CACHE_PREFIX):
            name, region = str(v.get("name", "")), str((v.get("environment") or {}).get("region") or "")
            if name.startswith(CACHE_PREFIX) and region and name.endswith(f"-{region.lower()}"):
                out.append(self._cache(v, name.removesuffix(f"-{region.lower()}")))
        return out

    async def open_cache(self, offer: Offer, cache: CacheSpec) -> CacheVolume | None:
        """The cache's volume in the offer's region: found, or made; None when the region refuses
        one, or the name is held by a volume elsewhere (a cold start). Leases in one region ask at
        once: the find-or-make runs under a lock per volume name (cache and region), and a volume this
        cloud found or made is remembered, so one volume is made and every lease gets it, whatever
        the listing's lag (a volume just made may be missing from it a while)."""
        name = volume_name(cache, offer.region)
        async with self._open_locks.setdefault(name, trio.Lock()):
            known = self._opened.get(name)
            if known is not None:
                return msgspec.structs.replace(known, path=cache.mount, created=False)
            volume = await self._find_or_make(offer, cache, name)
            if volume is not None:
                self._opened[name] = volume
            return volume

    async def _find(self, offer: Offer, cache: CacheSpec, name: str) -> tuple[CacheVolume | None, bool]:
        """The volume named `name` as listed: (it, True) in the offer's region, (None, True) when it
        lives in another region (moved, or made by hand: not ours to use), (None, False) when the
        listing does not show it."""
        for v in await self._volumes(name):
            if v.get("name") == name:
                if str((v.get("environment") or {}).get("region") or "") != offer.region:
                    return None, True  # the account's one volume of this name lives in another region
                return self._cache(v, cache.volume_name, cache.mount), True
        return None, False

    async def _find_or_make(self, offer: Offer, cache: CacheSpec, name: str) -> CacheVolume | None:
        found, listed = await self._find(offer, cache, name)
        if listed:
            return found
        env = await self.environment(offer.region)
        resp = await self.api.call("POST", "/core/volumes", json={
            "name": name, "environment_name": env, "size": cache.size_gb, "volume_type": self.volume_type,
            "description": f"actor-run cache {cache.name}"})
        body = body_json(resp)
        if resp.status_code == 200 and isinstance(body, dict) and body.get("status") is not False:
            return self._cache(body.get("volume") or {}, cache.volume_name, cache.mount, created=True)
        if resp.status_code == 409:  # already_exist: another controller made it meanwhile, ours too
            return (await self._find(offer, cache, name))[0]
        if resp.status_code in (200, 400, 404):  # refused (status false): nothing was made
            return None
        raise self._refused(f"creating volume {name}", resp)

    def _forget(self, volume_id: int | str) -> None:
        """A remembered volume deleted, or that could not be read (deleted elsewhere): found again next time."""
        for name, v in list(self._opened.items()):
            if v.id == str(volume_id):
                del self._opened[name]

    async def delete_cache(self, volume_id: str) -> None:
        self._forget(volume_id)
        resp = await self.api.call("DELETE", f"/core/volumes/{volume_id}")
        if resp.status_code not in (200, 404):
            raise self._refused(f"deleting volume {volume_id}", resp)

    async def _volume(self, volume_id: int) -> dict[str, Any]:
        resp = await self.api.call("GET", f"/core/volumes/{volume_id}")
        body = body_json(resp)
        if resp.status_code != 200 or not isinstance(body, dict) or body.get("status") is False:
            raise NoAnswer(f"hyperstack: reading volume {volume_id}: {short(resp)}")
        return dict(body.get("volume") or {})

    async def _vm_going(self, vm_id: int) -> bool:
        """Whether the VM holding a volume is on its way out (deleted, deleting): its attachment ends soon."""
        resp = await self.api.call("GET", f"/core/virtual-machines/{vm_id}")
        if resp.status_code == 404:
            return True
        body = body_json(resp)
        status = str(((body or {}).get("instance") or {}).get("status") or "") if isinstance(body, dict) else ""
        return status.upper() in GOING

    async def _attached_device(self, volume_id: int, vm_id: int) -> tuple[str, str]:
        """Attach the volume to the VM, waiting out an attach that lags and an attachment to a dying
        VM, up to `attach_wait_s`: (its device, "") or ("", why not)."""
        end = trio.current_time() + self.attach_wait_s
        asked, said = False, ""
        while True:
            v = await self._volume(volume_id)
            ours = [a for a in v.get("attachments") or [] if str(a.get("instance_id")) == str(vm_id)]
            others = [a for a in v.get("attachments") or [] if a.get("instance_id") not in (None, vm_id)]
            if ours and str(ours[0].get("status") or "").upper() == "ATTACHED":
                device = str(ours[0].get("device") or "")
                return (device, "") if DEVICE.fullmatch(device) else ("", f"the volume's device is {device!r}")
            for a in others:
                if not await self._vm_going(int(a["instance_id"])):
                    return "", (f"the volume is attached to VM {a['instance_id']}, which runs (a volume attaches "
                                "to one machine at a time)")
            if not ours and not others and not asked:
                resp = await self.api.call("POST", f"/core/virtual-machines/{vm_id}/attach-volumes",
                                           json={"volume_ids": [volume_id], "protected": False})
                answer = body_json(resp)
                if resp.status_code == 200 and isinstance(answer, dict) and answer.get("status") is not False:
                    asked = True
                else:  # not available yet (detaching from the last VM), or refused: asked again next round
                    said = short(resp)
            if trio.current_time() + self.poll_s > end:
                last = f" (the last answer: {said})" if said else ""
                return "", f"the volume did not attach within {self.attach_wait_s:g} s{last}"
            await trio.sleep(self.poll_s)

    async def attach_cache(self, offer: Offer, machine: Machine, workspace: Workspace) -> tuple[str, str]:
        """Attach the offer's volume to the machine and mount it at the cache's path: (path, "") or
        ("", why not)."""
        if not isinstance(workspace, ShellWorkspace):
            return "", "the machine has no shell to mount the volume in"
        try:
            device, why = await self._attached_device(int(offer.cache), int(machine.id))
        except NoAnswer:
            self._forget(int(offer.cache))
            raise
        if not device:
            return "", why
        self.attached[machine.id] = int(offer.cache)
        res = await workspace.host.run(mount_script(device, offer.cache_path), timeout=180.0)
        if res.exit_code != 0:
            return "", f"the volume did not mount at {offer.cache_path}: {res.error_text()[-300:]}"
        return offer.cache_path, ""

    async def detach(self, vm_id: str) -> None:
        """Before a VM's delete: let go of the cache volume this process attached to it (best
        effort: the delete detaches it too, later)."""
        volume_id = self.attached.pop(vm_id, None)
        if volume_id is None:
            return
        with contextlib.suppress(NoAnswer, RateLimited):  # the VM's delete detaches it all the same
            await self.api.call("POST", f"/core/virtual-machines/{vm_id}/detach-volumes",
                                json={"volume_ids": [volume_id]})


__all__ = ["HyperstackVolumes", "mount_script", "volume_name"]
