"""The five actors of an attempt and the runtime they stand on (pykka base, the trio reactor)."""

from actor_run.actors.attempt import AttemptActor
from actor_run.actors.base import Actor, Context, LedgerPort
from actor_run.actors.heartbeat import HeartbeatActor
from actor_run.actors.lease import LeaseActor
from actor_run.actors.meter import CostMeterActor, usage_between
from actor_run.actors.reattach import Reattach
from actor_run.actors.runtime import Reactor, ReactorStatistics, Result, Task
from actor_run.actors.transfer import TransferActor

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
