"""Tearing a SkyPilot cluster down with proof: `sky down`, then EC2 by tag whatever SkyPilot said.

A delete of cluster `name`:

1. stops any launch of it still pending or running on SkyPilot's server (unless its launch is
   known to have ended): a launch not stopped could still make an instance after the delete;
2. submits `sky down --async` (or finds one already running) and follows that request (its id
   read from `Submitted sky.Terminating request: <id>`), across
   calls (its id is kept: a caller's time limit may cut one call short), for up to
   `down_timeout_s`; when it succeeds, `sky status` must no longer list the cluster;
3. whatever step 2 said, asks EC2 for instances still tagged with the cluster, terminates each,
   and describes each until `terminated`.

`sky` failing, hanging or giving up hands the decision to EC2 alone (SkyPilot may then still list
the cluster; a later sweep tries again). The delete is confirmed only when EC2 shows nothing
alive and no launch can still make something; otherwise DeleteUnconfirmed, and the machine's
ledger row stays open.
"""

from __future__ import annotations

import time

import trio

from actor_run.protocols.clouds.ec2 import LIVE, Ec2, Ec2Error, Ec2Instance
from actor_run.protocols.clouds.skycli import ACTIVE, SkyCli, SkyFailed, SkyHung, submitted
from actor_run.protocols.failures import DeleteUnconfirmed, SpecError
from actor_run.protocols.logs import logger

CANCEL_S = 20.0  # one `sky api` call made while stopping a launch (three at most; each takes 5-15 s)


class Teardown:
    def __init__(self, cli: SkyCli, ec2: Ec2, *, poll_s: float, down_timeout_s: float) -> None:
        self.cli = cli
        self.ec2 = ec2
        self.poll_s = poll_s
        self.down_timeout_s = down_timeout_s
        self.settled: set[str] = set()  # clusters whose launch request is known to have ended
        self._downs: dict[str, tuple[str, float]] = {}  # cluster -> (down request id, when submitted)
        self._sky_gave_up: set[str] = set()  # clusters whose delete is EC2's alone now

    async def delete(self, name: str, regions: list[str]) -> None:
        launch_stopped = name in self.settled or await self.stop_launches(name)
        sky_done = False
        if name not in self._sky_gave_up:
            try:
                sky_done = await self._sky_down(name)
            except (SkyHung, SkyFailed, SpecError) as exc:
                logger.bind(machine=name).warning("skypilot: sky down {} failed ({}): EC2 decides", name, exc)
                self._sky_gave_up.add(name)
        # whatever SkyPilot said: an instance still tagged with the cluster is terminated here
        for region in regions:
            try:
                await self._terminate(region, name)
            except Ec2Error as exc:
                raise DeleteUnconfirmed(f"skypilot: {name}: {exc}") from exc
        if not launch_stopped:
            raise DeleteUnconfirmed(f"skypilot: a launch of {name} could not be stopped: it may still make an "
                                    "instance")
        if not sky_done:
            logger.bind(machine=name).warning("skypilot: {} terminated through EC2 (SkyPilot may still list it)",
                                              name)
        self._downs.pop(name, None)
        self._sky_gave_up.discard(name)
        self.settled.discard(name)

    async def stop_launches(self, name: str, *known: str) -> bool:
        """Cancel every launch of `name` still pending or running on SkyPilot's server (shielded,
        bounded): whether none is left that could still make an instance."""
        with trio.CancelScope(shield=True), trio.move_on_after(CANCEL_S * 3) as scope:
            try:
                if known:
                    await self.cli.cancel(*known)
                active = [r.request_id for r in await self.cli.active(name) if r.verb == "launch"]
                if active:
                    await self.cli.cancel(*active)
                    active = [r.request_id for r in await self.cli.requests(*active) if r.status in ACTIVE]
                return not active
            except (SkyHung, SkyFailed, SpecError) as exc:
                logger.bind(machine=name).warning("skypilot: could not stop the launch of {}: {}", name, exc)
                return False
        assert scope.cancelled_caught
        return False

    async def _sky_down(self, name: str) -> bool:
        """`sky down` through a request followed until it ends (across calls: its id is kept), then
        `sky status` must not list the cluster. False when SkyPilot has given up on it (EC2 decides);
        raises SkyHung/SkyFailed when `sky` itself does not answer sensibly."""
        if name not in self._downs:
            active = [r for r in await self.cli.active(name) if r.verb == "down"]
            if active:
                self._downs[name] = (active[0].request_id, active[0].created_at or time.time())
            else:
                res = await self.cli.run("down", "-y", "--async", name)
                if res.code != 0:
                    raise SkyFailed(f"sky down exited {res.code}: {res.tail()}")
                request = submitted(res.out + res.err)
                if request is None:  # "Cluster(s) not found": nothing for SkyPilot to do
                    return await self._absent(name)
                self._downs[name] = (request, time.time())
        request, since = self._downs[name]
        while True:
            r = await self.cli.request(request)
            if r is not None and r.status == "SUCCEEDED":
                return await self._absent(name)
            if r is None or r.status not in ACTIVE:
                self._sky_gave_up.add(name)
                logger.bind(machine=name).warning("skypilot: sky down {} {}: EC2 decides", name,
                                                  r.status.lower() if r else "was lost")
                return False
            if time.time() - since > self.down_timeout_s:
                self._sky_gave_up.add(name)
                logger.bind(machine=name).warning("skypilot: sky down {} still running after {:.0f} s: EC2 decides",
                                                  name, self.down_timeout_s)
                return False
            await trio.sleep(self.poll_s)

    async def _absent(self, name: str) -> bool:
        left = [c for c in await self.cli.clusters(name) if c.name == name]
        if left:
            raise SkyFailed(f"sky status still lists {name} ({left[0].status}) after sky down")
        return True

    async def _terminate(self, region: str, name: str) -> None:
        """Terminate each live instance tagged with the cluster and describe it until terminated."""
        live = await self.ec2.cluster_instances(region, name, LIVE)
        for i in live:
            logger.bind(machine=name).info("skypilot: terminating {} ({}) of {} through EC2", i.id, i.state, name)
            await self.ec2.terminate(i)
        for i in live:
            await self._wait_terminated(i)

    async def _wait_terminated(self, instance: Ec2Instance) -> None:
        pause = 0.2
        for _ in range(60):  # about four minutes; the caller's own time limit cuts it sooner
            state = await self.ec2.state(instance)
            if state == "terminated":
                return
            await trio.sleep(pause)
            pause = min(pause * 2, 5.0)
        raise Ec2Error(f"{instance.id} is not terminated yet")
