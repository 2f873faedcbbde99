"""EC2 directly, for what SkyPilot cannot be trusted with: the instances of a cluster found by the
tag SkyPilot puts on them, made to terminate on an OS shutdown, and terminated when SkyPilot could
not tear the cluster down (its API server wedged, its record of the cluster lost, its CLI hung).

SkyPilot tags every instance of a cluster with `skypilot-cluster-name = <name>-<user hash>` (its
`cluster_name_on_cloud`), so a cluster's instances are the ones tagged `<name>` or `<name>-*`, and
ours are the ones tagged `ar-*`. Terminated instances stay listed for about an hour: a search for
live instances excludes them by state.

boto3 is an optional dependency (the `skypilot` extra): importing it is deferred to the first
`Ec2` built, which raises SpecError naming the extra when it is missing. Its calls block, so each
runs on a worker thread (abandoned, never waited for, when the caller is cancelled), bounded by
botocore's own connect and read timeouts and its standard retry mode (throttling included).

Shutdown behavior: ModifyInstanceAttribute has two wire forms; the one with
`InstanceInitiatedShutdownBehavior={"Value": ...}` is accepted but ignored by moto, so the
`Attribute=..., Value=...` form is used, and the result is read back before it is trusted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from actor_run.protocols.failures import ActorRunError, SpecError
from actor_run.protocols.offload import to_thread

T = TypeVar("T")

CLUSTER_TAG = "skypilot-cluster-name"
LIVE = ["pending", "running", "stopping", "stopped", "shutting-down"]
# our cluster name, then the user hash SkyPilot appends to make its name on the cloud
_ON_CLOUD = re.compile(r"^(?P<name>.+-d\d+)(?:-[0-9a-z]+)?$")


class Ec2Error(ActorRunError):
    """An EC2 call failed or did not answer; the message names the call."""


class Ec2Instance:
    """One instance as DescribeInstances lists it: what a delete and a sweep need."""

    __slots__ = ("cluster", "id", "region", "state")

    def __init__(self, id: str, state: str, cluster: str, region: str) -> None:
        self.id, self.state, self.cluster, self.region = id, state, cluster, region

    @property
    def name(self) -> str:
        """Our cluster name: the tag without the user hash SkyPilot appended."""
        m = _ON_CLOUD.match(self.cluster)
        return m.group("name") if m else self.cluster

    def __repr__(self) -> str:
        return f"Ec2Instance({self.id}, {self.state}, {self.cluster}, {self.region})"


_LOADER: Any = None  # botocore's reader of service models, shared by every Ec2 of the process


def _botocore_session() -> Any:
    """A botocore session of its own (its own credentials, read from the environment at first use)
    whose service models come from one loader per process: EC2's model is megabytes of JSON, and a
    fresh session read it again for each client, once per region (py-spy: most of a SkyPilot
    test's own CPU)."""
    global _LOADER
    import botocore.loaders
    import botocore.session

    if _LOADER is None:
        _LOADER = botocore.loaders.create_loader()
    session = botocore.session.get_session()
    session.register_component("data_loader", _LOADER)
    return session


class Ec2:
    """The EC2 calls of one account, one client per region (boto3 clients are thread-safe)."""

    def __init__(self, *, endpoint_url: str = "", call_timeout_s: float = 20.0) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise SpecError("clouds.skypilot", "needs boto3 for its EC2 fallback: "
                                               "pip install 'actor-run[skypilot]'") from exc
        self._session = boto3.session.Session(botocore_session=_botocore_session())
        self._config = Config(connect_timeout=min(10.0, call_timeout_s), read_timeout=call_timeout_s,
                              retries={"max_attempts": 3, "mode": "standard"})
        self.endpoint_url = endpoint_url
        self.call_timeout_s = call_timeout_s
        self._clients: dict[str, Any] = {}

    def _client(self, region: str) -> Any:
        if region not in self._clients:
            kw: dict[str, Any] = {"region_name": region, "config": self._config}
            if self.endpoint_url:
                kw["endpoint_url"] = self.endpoint_url
            self._clients[region] = self._session.client("ec2", **kw)
        return self._clients[region]

    async def _call(self, what: str, fn: Callable[[], T]) -> T:
        # botocore bounds each HTTP exchange; this bounds the whole, retries included
        with trio.move_on_after(self.call_timeout_s * 4) as scope:
            try:
                return await to_thread(fn, abandon_on_cancel=True)
            except Exception as exc:  # botocore's ClientError, its connection errors, its parse errors
                raise Ec2Error(f"ec2 {what}: {type(exc).__name__}: {exc}") from exc
        assert scope.cancelled_caught
        raise Ec2Error(f"ec2 {what}: no answer within {self.call_timeout_s * 4:.0f} s")

    async def instances(self, region: str, tag_values: list[str], states: list[str] | None = None) -> list[Ec2Instance]:
        """Instances whose cluster tag matches one of `tag_values` (`*` wildcards), in `states`."""
        filters = [{"Name": f"tag:{CLUSTER_TAG}", "Values": tag_values}]
        if states:
            filters.append({"Name": "instance-state-name", "Values": states})
        client = self._client(region)

        def describe() -> list[Ec2Instance]:
            found = []
            for page in client.get_paginator("describe_instances").paginate(Filters=filters):
                for res in page.get("Reservations", []):
                    for i in res.get("Instances", []):
                        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                        found.append(Ec2Instance(i["InstanceId"], i["State"]["Name"], tags.get(CLUSTER_TAG, ""),
                                                 region))
            return found

        return await self._call(f"describe-instances in {region}", describe)

    async def cluster_instances(self, region: str, name: str, states: list[str] | None = None) -> list[Ec2Instance]:
        return await self.instances(region, [name, f"{name}-*"], states)

    async def terminate_on_shutdown(self, instance: Ec2Instance) -> str:
        """Make an OS shutdown terminate the instance; returns the behavior read back."""
        client = self._client(instance.region)

        def modify() -> str:
            client.modify_instance_attribute(InstanceId=instance.id, Attribute="instanceInitiatedShutdownBehavior",
                                             Value="terminate")
            got = client.describe_instance_attribute(InstanceId=instance.id,
                                                     Attribute="instanceInitiatedShutdownBehavior")
            return str(got.get("InstanceInitiatedShutdownBehavior", {}).get("Value", ""))

        return await self._call(f"modify-instance-attribute {instance.id}", modify)

    async def terminate(self, instance: Ec2Instance) -> None:
        """Terminate one instance (one call per id: a bad id fails the whole batch)."""
        client = self._client(instance.region)
        await self._call(f"terminate-instances {instance.id}",
                         lambda: client.terminate_instances(InstanceIds=[instance.id]))

    async def state(self, instance: Ec2Instance) -> str:
        """The instance's state now; `terminated` also for an id EC2 no longer knows."""
        client = self._client(instance.region)

        def describe() -> str:
            try:
                got = client.describe_instances(InstanceIds=[instance.id])
            except Exception as exc:
                if "InvalidInstanceID.NotFound" in str(exc):
                    return "terminated"
                raise
            for res in got.get("Reservations", []):
                for i in res.get("Instances", []):
                    return str(i["State"]["Name"])
            return "terminated"

        return await self._call(f"describe-instances {instance.id}", describe)


__all__ = ["CLUSTER_TAG", "LIVE", "Ec2", "Ec2Error", "Ec2Instance"]
