"""The five actors of an attempt and the runtime they stand on (pykka base, the trio reactor)."""

from actors.attempt import AttemptActor, Reattach
from actors.base import Actor, Context, LedgerPort
from actors.heartbeat import HeartbeatActor
from actors.lease import LeaseActor
from actors.meter import CostMeterActor, usage_between
from actors.runtime import Reactor, ReactorStatistics, Result, Task
from actors.transfer import TransferActor

__all__ = [
    "Actor",
    "AttemptActor",
    "Context",
    "CostMeterActor",
    "HeartbeatActor",
    "LeaseActor",
    "LedgerPort",
    "Reactor",
    "ReactorStatistics",
    "Reattach",
    "Result",
    "Task",
    "TransferActor",
    "usage_between",
]
