"""What a cloud may do beyond the Cloud protocol: each optional capability is a runtime-checkable
protocol here, and a cloud class that has one names it among its bases (so mypy checks the
signatures). Callers ask `isinstance(cloud, Capability)`, never `getattr`.

| capability       | member                       | who has it            | who asks                     |
|------------------|------------------------------|-----------------------|------------------------------|
| `Booting`        | `boots`                      | rented VMs            | the lease (its stage events) |
| `Cataloged`      | `gpu_names`, `region_names`  | rented VMs, sim       | the Runner's check of a job  |
| `Checking`       | `async check()`              | lambda                | the Runner's check of a job  |
| `LaunchChecking` | `check_launchable()`         | rented VMs            | the Runner, building a cloud |
| `SSHLogin`       | `login(machine)`             | rented VMs, ssh       | `actor-run ssh`              |
| `Reclaiming`     | `reclaim`                    | runpod-serverless     | the Runner, building a cloud |
| `MachineChecking`| `machine_check(offer)`       | every cloud but serverless | the lease, first connect |
| `Caching`        | `open_cache`, `list_caches`, ... | runpod, lambda, hyperstack | the lease, `sweep --caches` |
| `CacheAttaching` | `async attach_cache(...)`    | hyperstack            | the lease, after the check   |
| `SellsGpus`      | `sold_gpus`                  | sim                   | `actor-run clouds check`     |
| `PassingOver`    | `passed_over(index)`         | lambda, hyperstack    | `actor-run plan`             |

tests/protocols/clouds/test_capabilities.py holds the table of which registered cloud has which.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from actor_run.protocols.messages import CacheSpec, CacheVolume, Machine, Offer

if TYPE_CHECKING:
    from actor_run.protocols.clouds.verify import MachineCheck
    from actor_run.protocols.hosts.workspace import Workspace

Reclaim = Callable[[list[Machine]], Awaitable[list[Machine]]]


@runtime_checkable
class Booting(Protocol):
    """A cloud whose machines boot (a rented VM): its lease says each stage of the launch
    (booting, waiting for ssh) as an event while `boots` is true. A cloud without it (this
    computer, a sandbox, a queue) launches in one step, and a thousand of its leases pay no
    stage events."""

    boots: bool


@runtime_checkable
class Cataloged(Protocol):
    """A cloud that knows the GPU and region names a candidate may say: the Runner's check refuses a
    typo (exit 2, naming `candidates[i].gpu` or `.regions`) before anything starts. A cloud without
    it (local, ssh) takes any name."""

    @property
    def gpu_names(self) -> frozenset[str]:
        """What a candidate's `gpu` may say here (our names and the vendor's)."""
        ...

    @property
    def region_names(self) -> frozenset[str] | None:
        """What a candidate's `regions` may say here; None: not checked."""
        ...


@runtime_checkable
class Checking(Protocol):
    """A cloud with settings only the provider can confirm (a Lambda file system that exists)."""

    async def check(self) -> None:
        """Ask the provider whether the settings hold; raise SpecError naming the field when not.
        A trio coroutine, run on the reactor once per cloud and Runner before any job starts."""
        ...


@runtime_checkable
class LaunchChecking(Protocol):
    """A cloud that needs something local to launch a machine we can reach (a rented cloud's
    `ssh_key`), checked when the Runner builds it so that a run fails before any job starts."""

    def check_launchable(self) -> None:
        """Raise SpecError (naming the setting) when this cloud could not launch a machine we can
        reach. Reads local files only; any thread."""
        ...


@runtime_checkable
class SSHLogin(Protocol):
    """A cloud whose machines take a shell from OpenSSH (`actor-run ssh`)."""

    def login(self, machine: Machine) -> list[str]:
        """The OpenSSH client's arguments (without the remote command) for a shell on `machine`,
        held to its pinned host key; nothing is connected here. Any thread."""
        ...


@runtime_checkable
class Reclaiming(Protocol):
    """A cloud that may free quota by deleting machines of ours nobody needs: the Runner installs
    `reclaim`, which answers which of the given machines the sweep's rules let go."""

    reclaim: Reclaim | None


@runtime_checkable
class MachineChecking(Protocol):
    """A cloud whose machines are checked before the job (clouds/verify.py): their GPUs and clock."""

    def machine_check(self, offer: Offer) -> MachineCheck | None:
        """What to check on a machine of `offer` (None: nothing)."""
        ...


@runtime_checkable
class Caching(Protocol):
    """A cloud that keeps volumes that outlive an attempt (a candidate's `cache`)."""

    @property
    def cache_usd_per_gb_month(self) -> float:
        """What a GB of such a volume costs a month."""
        ...

    async def open_cache(self, offer: Offer, cache: CacheSpec) -> CacheVolume | None:
        """Find or make the volume in the offer's region; None where it cannot be kept."""
        ...

    async def list_caches(self) -> list[CacheVolume]:
        """Our volumes at the provider."""
        ...

    async def delete_cache(self, volume_id: str) -> None:
        """Delete one of them."""
        ...


@runtime_checkable
class SellsGpus(Protocol):
    """A cloud that can say which GPU classes it sells (the sim: what its regions list)."""

    @property
    def sold_gpus(self) -> tuple[str, ...]:
        """The GPU classes sold, in our names."""
        ...


@runtime_checkable
class CacheAttaching(Protocol):
    """A cloud whose cache volume is attached to a machine once it runs, and formatted (when blank)
    and mounted by us (Hyperstack's block volumes), not mounted by the provider at the create."""

    async def attach_cache(self, offer: Offer, machine: Machine, workspace: Workspace) -> tuple[str, str]:
        """Attach the volume `offer.cache` to `machine` and mount it at `offer.cache_path`: `(path, "")`
        once the job can use it, `("", why)` when it cannot (a cold start). Raises NoAnswer or
        HostError when the provider or the machine did not answer (a cold start too). A trio
        coroutine, on the reactor, after the machine's check."""
        ...


@runtime_checkable
class PassingOver(Protocol):
    """A cloud whose `offers` leaves out places that have stock for a reason of its own (a region with
    no image whose CUDA the GPU class needs), and can say which and why."""

    def passed_over(self, index: int) -> list[str]:
        """What the last `offers` for candidate `index` left out, a line each ("us-west-1: no image
        with CUDA 12.8 or newer for B200"); empty when nothing. Any thread; no I/O."""
        ...


__all__ = [
    "Booting", "CacheAttaching", "Caching", "Cataloged", "Checking", "LaunchChecking", "MachineChecking",
    "PassingOver", "Reclaim", "Reclaiming", "SSHLogin", "SellsGpus",
]
