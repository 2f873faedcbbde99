"""A new machine's check before anything is uploaded to it (protocols/clouds/verify.py: its GPUs and
its clock), where its cloud asks for one (`MachineChecking`), and what a launch's failure means
(`classify_launch`: the code a LeaseFailed carries)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import trio

from actor_run.actors.durable import IntentNotRecorded
from actor_run.protocols.clouds import MachineChecking, verify_machine
from actor_run.protocols.failures import ActorRunError, CallCancelled, Code, HostError, LaunchError, Refused
from actor_run.protocols.hosts.workspace import Workspace
from actor_run.protocols.messages import Machine, Offer

T = TypeVar("T")


async def check_machine(cloud: Any, offer: Offer, machine: Machine, workspace: Workspace) -> None:
    """Check the machine where its cloud asks for it; one that fails is refused (`launch_failed`,
    raised) and the lease's release deletes the machine. Reactor thread."""
    want = cloud.machine_check(offer) if isinstance(cloud, MachineChecking) else None
    if want is not None:
        await verify_machine(workspace, want, machine.name)


async def closed_on_failure(workspace: Workspace, step: Awaitable[T]) -> T:
    """`await step`, and if it raises (or is cancelled) the workspace is closed first, shielded: a
    launch that fails after its connect (the check, a cache's attach) leaves no connection open
    (its machine is the release's to delete). Reactor thread."""
    try:
        return await step
    except BaseException:
        with trio.CancelScope(shield=True):
            await workspace.aclose()
        raise


def classify_launch(exc: BaseException, *, created: bool) -> tuple[Code, str]:
    """The failure code and the words of a launch that raised `exc` (`created`: a machine exists)."""
    if isinstance(exc, IntentNotRecorded):
        return Code.INTERNAL, str(exc)
    if isinstance(exc, LaunchError | Refused):
        return exc.code, str(exc)
    if isinstance(exc, trio.TooSlowError):
        return Code.LAUNCH_FAILED, "the machine did not become reachable in time"
    if isinstance(exc, HostError):
        return Code.LAUNCH_FAILED, f"the machine came up but could not be reached: {exc}"
    if isinstance(exc, CallCancelled):
        return Code.CANCELED, str(exc)
    if isinstance(exc, ActorRunError | OSError):
        return (Code.AMBIGUOUS_CREATE if not created else Code.LAUNCH_FAILED), str(exc)
    return Code.INTERNAL, f"{type(exc).__name__}: {exc}"


__all__ = ["check_machine", "classify_launch"]
