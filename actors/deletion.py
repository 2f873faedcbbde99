"""Deleting a lease's machine until its provider confirms it gone: the workspace closed first, then
the cloud's delete asked again with backoff, bounded in time (`delete_confirmed`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import trio

from actor_run.protocols.failures import DeleteUnconfirmed, HostError
from actor_run.protocols.hosts.workspace import Workspace

DELETE_TRIES = 5


async def delete_confirmed(cloud: Any, name: str, machine_id: str, workspace: Workspace | None, timeout_s: float,
                           asked: Callable[[float], None]) -> tuple[bool, str]:
    """Close `workspace` (if any), then delete the machine until `cloud` confirms it (at most
    DELETE_TRIES tries within `timeout_s`, backoffs included); `asked(t)` hears when the delete
    that worked went out (the provider stops billing then, not when we hear back). Answers
    (confirmed, the provider's last words when not). Reactor thread."""
    if workspace is not None:
        # trio's own scope, not `move_on_after` (a generator-made context manager around it: a
        # thousand deletes of an end burst paid for both)
        # (HostError: the connection is going with the machine)
        with trio.CancelScope(deadline=trio.current_time() + 10), contextlib.suppress(HostError):
            await workspace.aclose()
    detail = "no answer"
    said = ""  # the provider's last words: a later try that only timed out does not hide them
    per_try = timeout_s / DELETE_TRIES
    end = trio.current_time() + timeout_s  # the whole of it, backoffs included
    for i in range(DELETE_TRIES):
        try:
            # one scope a try, its deadline the try's or the whole's (a thousand deletes at once:
            # each cancel scope costs the reactor tens of microseconds)
            with trio.CancelScope(deadline=min(end, trio.current_time() + per_try)) as attempt:
                at = time.time()
                await cloud.delete(name, machine_id)
            if attempt.cancelled_caught:  # as `fail_at` says it, without its context manager
                raise trio.TooSlowError
            asked(at)
            return True, ""
        except (DeleteUnconfirmed, HostError, OSError, trio.TooSlowError) as exc:
            text = str(exc) or type(exc).__name__
            if isinstance(exc, trio.TooSlowError):
                detail = f"{said}; then no answer within {per_try:.1f} s" if said else text
            else:
                detail = said = text
        pause = min(2.0**i * 0.2, 5.0)
        if i + 1 == DELETE_TRIES or trio.current_time() + pause >= end:  # no pause after the last try
            break
        await trio.sleep(pause)
    return False, detail


__all__ = ["DELETE_TRIES", "delete_confirmed"]
