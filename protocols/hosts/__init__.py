"""Hosts: how to talk to a machine (run a script, send and receive files, start detached)."""

from actor_run.protocols.hosts.base import Host, RunResult
from actor_run.protocols.hosts.local import LocalHost
from actor_run.protocols.hosts.workspace import Launch, PollResult, PollsNow, ShellWorkspace, Workspace
from actor_run.protocols.messages import InputRef

__all__ = [
    "Host", "InputRef", "Launch", "LocalHost", "PollResult", "PollsNow", "RunResult", "ShellWorkspace", "Workspace",
]
