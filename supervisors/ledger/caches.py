"""What the ledger records of cache volumes (a candidate's `cache`): one row per (cloud, region,
volume name), written before the provider is asked to make it (so a crash between the create and
its answer still leaves a name to list and delete), given the provider's id once it is found or
made, and closed by `actor-run sweep --caches`. A run never deletes a cache.

Storage is billed from `created` to `deleted` (or now) at `usd_per_gb_month` (the cloud's price,
stored with the row: a later price change does not rewrite what was spent)."""

from __future__ import annotations

import time

from actor_run.supervisors.ledger.core import LedgerCore
from actor_run.supervisors.ledger.queue import Waiter


class CacheRecords(LedgerCore):
    """The ledger's writes about cache volumes (a part of `Ledger`)."""

    def queue_cache(self, *, cloud: str, region: str, name: str, size_gb: int, usd_per_gb_month: float) -> Waiter:
        """The intent, queued, before the provider is asked to find or make the volume (its Waiter
        says when it is durable). A row already there (a found volume, an earlier run's) is kept."""
        row = (cloud, region, name, size_gb, "requested", time.time(), usd_per_gb_month, self.owner)
        return self._track((
            "INSERT OR IGNORE INTO caches (cloud, region, name, size_gb, state, created, usd_per_gb_month, owner)"
            " VALUES (?,?,?,?,?,?,?,?)", row))

    def record_cache(self, *, cloud: str, region: str, name: str, volume_id: str, created_at: float) -> None:
        """The provider holds the volume `volume_id` (found or made); its bill runs from `created_at`."""
        self._submit(("UPDATE caches SET volume_id=?, created=CASE WHEN state='alive' THEN created ELSE ? END,"
                      " state='alive', deleted=NULL WHERE cloud=? AND region=? AND name=?",
                      (volume_id, created_at or time.time(), cloud, region, name)))

    def record_cache_deleted(self, *, cloud: str, region: str, name: str, at: float) -> None:
        self._submit(("UPDATE caches SET state='deleted', deleted=? WHERE cloud=? AND region=? AND name=?",
                      (at, cloud, region, name)), wait=True)


__all__ = ["CacheRecords"]
