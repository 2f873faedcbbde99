"""The embedding API: what a host program (or the command line) holds to run jobs.

    runner.py        Runner: opens the reactor, the ledger and the tree; submit, wait, cancel, close
                     (sync, or `async with` in asyncio and trio)
    handle.py        JobHandle: one submitted job, waited on from a thread, asyncio or trio; the
                     small port it talks to the Runner through
    event_bus.py     EventBus: every event to the ledger, the budget's live cost, the subscribers
    takeover.py      Takeover: `resume` and `sweep` of what dead controllers left
    job_checks.py    JobChecks: a job checked before anything starts; the clouds it leases from
    shield.py        how `async with` waits for open and close, shielded from the host's cancellation
    notify.py        webhooks told of failed jobs, a run's end, budget shares (the user's [notify])
    places.py        the state folder, the results folder, run ids
    config.py        the user's settings file, merged under a batch's own
    gc_tuning.py     the collector's thresholds while a Runner is open

The Runner is composed of these objects (it holds them; they hold nothing of it).

What it may import: protocols, actors, the tree, the ledger. Never the command line or the views
(the library prints nothing; the command line renders).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actor_run.protocols import lazy

if TYPE_CHECKING:  # what a type checker reads; at run time each name loads on first use (PEP 562)
    from actor_run.supervisors.api.config import UserConfig, load_config
    from actor_run.supervisors.api.handle import JobHandle
    from actor_run.supervisors.api.runner import Runner

_WHERE = {
    "JobHandle": "actor_run.supervisors.api.handle",
    "Runner": "actor_run.supervisors.api.runner",
    "UserConfig": "actor_run.supervisors.api.config",
    "load_config": "actor_run.supervisors.api.config",
}

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy.exports(globals(), _WHERE)

__all__ = ["JobHandle", "Runner", "UserConfig", "load_config"]
