"""Hosts: how to talk to a machine (run a script, send and receive files, start detached)."""

from protocols.hosts.base import Host, RunResult
from protocols.hosts.local import LocalHost
from protocols.hosts.workspace import Launch, PollResult, ShellWorkspace, Workspace
from protocols.messages import InputRef

__all__ = ["Host", "InputRef", "Launch", "LocalHost", "PollResult", "RunResult", "ShellWorkspace", "Workspace"]
