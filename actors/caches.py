"""A lease's cache (a candidate's `cache`): its ledger row before the provider is asked, the volume
found or made in the offer's region before the create, and, on a cloud that attaches it to a
running machine (`CacheAttaching`: Hyperstack's volumes), attached and mounted after the machine's
check. A place that cannot host it starts cold (a `CacheOpened(cold=True)` says why), or with
`cache.required` is refused: before the create a clean `no_capacity` (the walk goes on, nothing was
made); after it `launch_failed` (the release deletes the machine).

    opener = CacheOpener(ctx, cloud, key, offer, cache, head, note)   # the actor's thread: the row is queued
    placed = await opener.place(offer, soon)                          # the reactor, before the create
    machine = await opener.attach(placed, machine, workspace)         # the reactor, after the check
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from actor_run.actors.base import Context, Pending
from actor_run.actors.durable import wait_durable
from actor_run.protocols.clouds import CacheAttaching, Caching
from actor_run.protocols.clouds.http import NoAnswer, RateLimited
from actor_run.protocols.failures import Code, LaunchRefused
from actor_run.protocols.hosts.workspace import Workspace
from actor_run.protocols.messages import CacheOpened, CacheSpec, CacheVolume, Machine, Offer

# A batch's leases start together, and each one's find-or-make would list no volume and make its own:
# RunPod keeps several volumes of one name (each billed), Lambda refuses a name twice (the others
# started cold). So this process opens a cache in a region one lease at a time, per cloud.
_opening: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], trio.Lock]] = weakref.WeakKeyDictionary()


async def open_cache_once(cloud: Caching, offer: Offer, cache: CacheSpec) -> CacheVolume | None:
    """`cloud.open_cache(offer, cache)`, one call at a time per cache and region of that cloud in this
    process (the next finds what the first made). Reactor thread."""
    locks = _opening.setdefault(cloud, {})
    async with locks.setdefault((cache.volume_name, offer.region), trio.Lock()):
        return await cloud.open_cache(offer, cache)


class CacheOpener:
    """One lease's cache, from its ledger row to its mount. Built on the actor's thread (it queues
    the row, or says at once that the cloud keeps no volumes); `place` and `attach` run on the
    reactor and tell the actor what happened through `note` (which must not block)."""

    def __init__(self, ctx: Context, cloud: Any, key: str, offer: Offer, cache: CacheSpec | None,
                 head: dict[str, Any], note: Callable[[CacheOpened], None]) -> None:
        self.cloud, self.key, self.cache, self.head, self.note = cloud, key, cache, head, note
        self.row: Pending | None = None
        if cache is None:
            return
        if isinstance(cloud, Caching):  # its row before the provider is asked (it may make a volume)
            self.row = ctx.ledger.queue_cache(cloud=key, region=offer.region, name=cache.volume_name,
                                              size_gb=cache.size_gb, usd_per_gb_month=cloud.cache_usd_per_gb_month)
        else:
            ctx.emit(CacheOpened(**head, cache=cache.volume_name, cloud=key, region=offer.region, cold=True,
                                 detail=f"{offer.cloud} keeps no cache volumes: a cold start"))

    def _cold(self, region: str, why: str) -> None:
        assert self.cache is not None
        self.note(CacheOpened(**self.head, cache=self.cache.volume_name, cloud=self.key, region=region, cold=True,
                              detail=f"{why}: a cold start"))

    async def place(self, offer: Offer, soon: Callable[[Callable[[], Any]], None]) -> Offer:
        """Find or make the cache's volume in the offer's region (before the create); the offer to
        launch, carrying it (unchanged for a cold start). Raises IntentNotRecorded when the ledger
        could not write the row, LaunchRefused(no_capacity) for a required cache that cannot be
        kept here. Reactor thread."""
        cache = self.cache
        if cache is None or self.row is None:
            return offer
        await wait_durable(self.row, soon, "the cache's row")
        name = cache.volume_name
        try:
            volume = await open_cache_once(self.cloud, offer, cache)
            why = "" if volume is not None else f"{offer.cloud} cannot keep a volume in {offer.region or 'this place'}"
        except (NoAnswer, RateLimited) as exc:
            volume, why = None, f"the provider did not answer for the volume: {exc}"
        if volume is None:
            if cache.required:
                raise LaunchRefused(f"cache {name}: {why} (cache.required: this place is skipped)",
                                    code=Code.NO_CAPACITY)
            self._cold(offer.region, why)
            return offer
        self.note(CacheOpened(**self.head, cache=name, cloud=self.key, region=offer.region, volume=volume.id,
                              path=volume.path, created=volume.created))
        return msgspec.structs.replace(offer, cache=volume.id, cache_path=volume.path)

    async def attach(self, placed: Offer, machine: Machine, workspace: Workspace) -> Machine:
        """On a cloud that attaches the volume to a running machine: attach it and mount it at the
        cache's path; the machine as the job sees it (`cache` "" when it starts cold, said in a
        `CacheOpened`). A required cache that does not attach raises LaunchRefused(launch_failed)
        (the machine exists: the release deletes it). Reactor thread."""
        cache = self.cache
        if cache is None or not placed.cache or not isinstance(self.cloud, CacheAttaching):
            return machine
        try:
            path, why = await self.cloud.attach_cache(placed, machine, workspace)
        except Exception as exc:  # no answer, a host error, a slow attach, an answer we could not read
            path, why = "", f"the volume did not attach: {type(exc).__name__}: {exc}"
        if path:
            return msgspec.structs.replace(machine, cache=path)
        if cache.required:
            raise LaunchRefused(f"cache {cache.volume_name}: {why} (cache.required)", code=Code.LAUNCH_FAILED)
        self._cold(placed.region, why)
        return msgspec.structs.replace(machine, cache="")


def record_cache_opened(ctx: Context, event: CacheOpened) -> None:
    """The cache's volume (its id, once the provider holds it) in the ledger, and the event. The
    lease's thread."""
    if event.volume:
        ctx.ledger.record_cache(cloud=event.cloud, region=event.region, name=event.cache, volume_id=event.volume,
                                created_at=time.time())
    ctx.emit(event)


__all__ = ["CacheOpener", "record_cache_opened"]
