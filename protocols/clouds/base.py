"""The Cloud protocol: where machines come from.

A cloud answers offers for a candidate, launches a named machine (a clean refusal raises
`LaunchRefused`, anything that may have made a machine raises `LaunchAmbiguous`), connects a
workspace to it, deletes it (idempotent: an unknown name is already gone; returns only once the
provider confirms it is gone, else raises `DeleteUnconfirmed`) and lists ours by name prefix.
Every method is a trio coroutine that runs on the reactor. What a cloud may do besides (boot
stages, a login shell, checks before a run) is declared in capabilities.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # the hosts bring trio: reading a cloud's name or settings needs none of it
    from actor_run.protocols.hosts.workspace import Workspace


class Cloud(Protocol):
    name: str
    account: str  # which of the cloud's accounts this object speaks for ("" is the cloud's own settings)

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        """Places with stock now for `candidate`, cheapest first; [] when none has stock."""
        ...

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        """Create a machine named `name` and wait until it is usable."""
        ...

    async def connect(self, machine: Machine) -> Workspace:
        """A workspace on the machine (its root prepared and checked)."""
        ...

    async def delete(self, name: str, machine_id: str = "") -> None:
        """Delete the machine and wait until the provider confirms it is gone."""
        ...

    async def list_ours(self, prefix: str) -> list[Machine]:
        """Every machine whose name starts with `prefix` that the provider still holds."""
        ...

    async def aclose(self) -> None:
        ...
