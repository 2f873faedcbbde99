"""actor-run: run GPU jobs on rented machines in attempts (always deleted, retried, metered).

The public API is what this module exports (`__all__`); everything under `actor_run.actors`,
`actor_run.protocols` and `actor_run.supervisors` is internal and may change.

    from actor_run import Batch, Runner

    batch = Batch.load("sweep.toml")                 # or Batch.build(name=..., command=..., seeds=[...])
    with Runner(out_dir="out", concurrency=batch.policy.concurrency) as runner:
        handles = [runner.submit(job) for job in batch.jobs()]
        for h in handles:
            ended = h.result()                       # a JobEnded: outcome, failure, attempts, usd
            # in asyncio or trio: ended = await h.wait_async()

- `Runner`, `JobHandle`: run jobs, wait for them, cancel them; every machine deleted on close.
- `Job`, `Batch`, `Policy`, `Candidate`: what to run, how often to retry, where.
- `UserConfig`: the user's settings file (`[clouds.*]` tables merged under a batch's own).
- Events (`Event` and its subclasses): what `Runner.subscribe` callbacks receive, in order per
  attempt: `AttemptStarted`, `LeaseRequested`, `LeaseStage`..., `Leased` | `LeaseFailed`, `Uploaded`, `JobStarted`,
  `Progress`..., `Exited` | `Stalled`, `Fetched`, `Released`, `AttemptEnded`, then `Retrying` or
  `JobEnded` for the job (`WaitingForCapacity` while no place has stock; `Reserved` and `Charged`
  are the budget's, `Metered` the running cost).
  `encode(event)` / `decode_event(data)` are the JSON form `--json` prints.
- `Code`: every failure's code (`no_capacity`, `job_failed`, ...); `SpecError`: bad input, naming
  the field; `ActorRunError`: the base of every exception raised on purpose.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actor_run.protocols import lazy
from actor_run.protocols.version import package_version

if TYPE_CHECKING:  # what a type checker and an IDE read; at run time each name loads on first use
    from actor_run.protocols.failures import ActorRunError, Code, SpecError
    from actor_run.protocols.messages import (
        AttemptEnded,
        AttemptStarted,
        CacheOpened,
        Charged,
        CheckpointSaved,
        Event,
        Exited,
        Fetched,
        InputRef,
        JobEnded,
        JobStarted,
        Leased,
        LeaseFailed,
        LeaseRequested,
        LeaseStage,
        Machine,
        Metered,
        Offer,
        Progress,
        Released,
        Reserved,
        Retrying,
        Stalled,
        TransferFailed,
        Uploaded,
        Usage,
        WaitingForCapacity,
        decode_event,
        encode,
    )
    from actor_run.protocols.specs import Batch, Job, load_batch
    from actor_run.protocols.specs import CandidateSpec as Candidate
    from actor_run.protocols.specs import PolicySpec as Policy
    from actor_run.supervisors.api.config import UserConfig, load_config
    from actor_run.supervisors.api.handle import JobHandle
    from actor_run.supervisors.api.runner import Runner

    __version__: str

# public name -> (the module it lives in, its name there). Loaded on first use (PEP 562), so that
# `import actor_run` (every `actor-run` process imports it) costs nothing it does not use: the
# Runner alone brings trio, pykka and every cloud.
_WHERE = {
    **{name: ("actor_run.protocols.failures", name) for name in ("ActorRunError", "Code", "SpecError")},
    **{name: ("actor_run.protocols.messages", name) for name in (
        "AttemptEnded", "AttemptStarted", "CacheOpened", "Charged", "CheckpointSaved", "Event", "Exited", "Fetched",
        "InputRef",
        "JobEnded", "JobStarted", "LeaseFailed", "LeaseRequested", "LeaseStage", "Leased", "Machine", "Metered",
        "Offer", "Progress", "Released", "Reserved", "Retrying", "Stalled", "TransferFailed", "Uploaded", "Usage",
        "WaitingForCapacity", "decode_event", "encode")},
    "Batch": ("actor_run.protocols.specs", "Batch"),
    "Candidate": ("actor_run.protocols.specs", "CandidateSpec"),
    "Job": ("actor_run.protocols.specs", "Job"),
    "Policy": ("actor_run.protocols.specs", "PolicySpec"),
    "load_batch": ("actor_run.protocols.specs", "load_batch"),
    "UserConfig": ("actor_run.supervisors.api.config", "UserConfig"),
    "load_config": ("actor_run.supervisors.api.config", "load_config"),
    "JobHandle": ("actor_run.supervisors.api.handle", "JobHandle"),
    "Runner": ("actor_run.supervisors.api.runner", "Runner"),
}


if not TYPE_CHECKING:  # hidden from mypy, which then still flags a name this package does not export
    __getattr__, __dir__ = lazy.exports(globals(), _WHERE, computed={"__version__": package_version})


__all__ = [
    "ActorRunError",
    "AttemptEnded",
    "AttemptStarted",
    "Batch",
    "CacheOpened",
    "Candidate",
    "Charged",
    "CheckpointSaved",
    "Code",
    "Event",
    "Exited",
    "Fetched",
    "InputRef",
    "Job",
    "JobEnded",
    "JobHandle",
    "JobStarted",
    "LeaseFailed",
    "LeaseRequested",
    "LeaseStage",
    "Leased",
    "Machine",
    "Metered",
    "Offer",
    "Policy",
    "Progress",
    "Released",
    "Reserved",
    "Retrying",
    "Runner",
    "SpecError",
    "Stalled",
    "TransferFailed",
    "Uploaded",
    "Usage",
    "UserConfig",
    "WaitingForCapacity",
    "__version__",
    "decode_event",
    "encode",
    "load_batch",
    "load_config",
]
