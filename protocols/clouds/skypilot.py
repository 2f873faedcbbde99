"""The `skypilot` cloud: SkyPilot clusters on AWS, one single-node cluster per machine, driven
through the `sky` command line (protocols/clouds/skycli.py), with EC2 itself as the backstop
(protocols/clouds/ec2.py) and deletes proven by both (protocols/clouds/skydelete.py).

SkyPilot picks the instance; this module keeps what SkyPilot lacks:

- **One attempt is one placement.** Each launch is pinned to one region (`--infra aws/<region>`)
  without `--retry-until-up`: SkyPilot's own failover stays off, the walk across regions is the
  candidates'. The launch goes out with `--async`; its request is followed to its end.
- **The cluster is busy exactly as long as its lease.** SkyPilot's skylet autostops a cluster
  when no job of its queue runs and no SSH session has a terminal under sshd (`jobs_and_ssh`,
  skylet/autostop_lib.py `has_active_ssh_sessions`): our SSH sessions have no terminal and do
  not count. So the launch's own run command sleeps until the machine's deadline (a job skylet
  sees running), and `--down -i <idle>` still deletes the cluster `idle` minutes after that
  deadline when no controller is left to do it.
- **Its answers are classified**: a `ResourcesUnavailableError` is `no_capacity` (`quota` when
  AWS's vCPU or instance limit is what it wraps), any other failed launch `launch_failed` (the
  cluster is torn down first: `--down` is not applied to a launch that failed), a launch that
  does not finish in `launch_timeout_s` or a `sky` that hangs is `ambiguous_create` (its request
  is cancelled; the lease reconciles by name, and a delete finds what was made by cluster name
  and by EC2 tag); a head whose instance EC2 says ended is `preempted` (a spot instance taken back).
- **The deadline is on the machine**: right after the launch, each instance of the cluster is set
  to terminate on an OS shutdown (read back: a machine that would only stop is not used), and on
  connect the head node schedules its own shutdown a minute before the deadline.
- **A delete is proven** (protocols/clouds/skydelete.py): `sky down` (async, its request
  followed across tries for up to `down_timeout_s`), then `sky status` must no longer list the
  cluster; whatever happened there, EC2 is then asked for instances still tagged with the
  cluster's name, each is terminated and described until `terminated`. When `sky` fails or hangs,
  EC2 alone decides, and a launch that could not be stopped keeps the delete unconfirmed.
- **The sweep** lists `sky status -u` filtered by our prefix AND EC2 instances tagged `ar-*`, so a
  cluster SkyPilot forgot (its record purged, its server reset) is still found.
- **Cost** is the lowest hourly price SkyPilot's catalog gives for exactly that GPU name in that
  region (spot or not), from `sky gpus list -o json` (`sky show-gpus` on a CLI without it); the
  meter caps it at the deadline. A GPU SkyPilot gives no price for there is not offered, unless
  `fallback_hourly_usd` is set: then it is metered at that price (never at $0).

The head node is reached over our persistent SSH host (protocols/hosts/ssh.py) at the address
`sky status --ip` gives, with its host key pinned in a known-hosts file of its own cluster: a
cloud reuses addresses, and a new cluster at an old address is a new machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, NoReturn

import msgspec
import trio

from actor_run.protocols.clouds.capabilities import MachineChecking
from actor_run.protocols.clouds.ec2 import LIVE, Ec2, Ec2Error, Ec2Instance
from actor_run.protocols.clouds.gpus import gpu_class, gpu_count
from actor_run.protocols.clouds.skycli import ACTIVE, CLI_TIMEOUT_S, SkyCli, SkyFailed, SkyHung, submitted
from actor_run.protocols.clouds.skydelete import Teardown
from actor_run.protocols.clouds.verify import MachineCheck
from actor_run.protocols.failures import (
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchRefused,
    MachineGone,
    Refused,
    SpecError,
    Unreachable,
)
from actor_run.protocols.hosts.aio import AsyncioLoop
from actor_run.protocols.hosts.ssh import SSHHost
from actor_run.protocols.hosts.workspace import MAX_LOG_PER_POLL, PollResult, ShellWorkspace, Workspace
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.names import parse_name
from actor_run.protocols.specs import CandidateSpec

# our GPU names -> SkyPilot's accelerator names (the rest are spelled the same)
GPUS = {"A100-80G": "A100-80GB", "A100-40G": "A100", "H100-80G": "H100"}
PRICE_TTL_S = 600.0

def hold_command(deadline: float) -> str:
    """The cluster's own job (ours run over SSH): a sleep until the machine's deadline, so that
    skylet sees a running job and does not autostop the cluster under ours. It ends at the
    deadline whenever the cluster came up, and `--down -i N` then deletes the cluster N minutes
    later if nobody did."""
    return f"sleep $(( {math.ceil(deadline)} - $(date +%s) ))"


class SkyPilotSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    infra: str = "aws"  # aws[/region[/zone]]; a candidate's regions replace the region
    sky: str = "sky"  # the command (split like a shell would)
    api_server: str = ""  # SkyPilot's API server endpoint; default: SkyPilot's own configuration
    ssh_key: str = ""  # the key that logs in to the head node (SkyPilot's); default: agent and ~/.ssh
    ssh_user: str = "ubuntu"
    ssh_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 22
    root: str = "~/actor-run"  # the private folder on the head node
    use_spot: bool = False
    check_gpu: bool = True  # before the job: nvidia-smi lists the GPUs asked (false: only the clock)
    image_id: str = ""  # `sky launch --image-id` (an AMI, or docker:<image>); a candidate's `image` wins
    idle_minutes: Annotated[int, msgspec.Meta(ge=1)] = 15  # SkyPilot's autodown once idle this long
    ec2_endpoint: str = ""  # EC2's endpoint; default: AWS's own for the region
    regions: list[str] = msgspec.field(default_factory=list)  # where a sweep also looks for instances
    # run on the head node at connect: powers it off (so EC2 terminates it) a minute before the deadline
    deadline_command: str = "sudo -n shutdown -h +{minutes}"
    poll_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    cli_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = CLI_TIMEOUT_S  # one `sky` command (each takes 5-15 s)
    # the price of a GPU SkyPilot's catalog gives none for there (a GPU AWS does not sell singly):
    # unset, such a place is not offered; set, it is metered at this price
    fallback_hourly_usd: Annotated[float, msgspec.Meta(gt=0)] | None = None
    launch_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 1800.0  # a launch request, to its end
    # a down request, before EC2 takes over (within the lease's two minutes of deleting)
    down_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 90.0
    ec2_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 20.0  # one EC2 exchange
    connect_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    known_hosts: str = ""  # a folder, one file per cluster; default: <state_dir>/skypilot/known_hosts


def _region_of(infra: str) -> str:
    parts = infra.split("/")
    return parts[1] if len(parts) > 1 else ""


def classify(log: str) -> Code:
    """A failed launch's code from what its request printed (the remote exception). AWS's quota
    errors come wrapped in SkyPilot's ResourcesUnavailableError: they are looked for first."""
    if any(q in log for q in ("VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded")):
        return Code.QUOTA
    if "ResourcesUnavailableError" in log or "InsufficientInstanceCapacity" in log:
        return Code.NO_CAPACITY
    return Code.LAUNCH_FAILED


class SkyPilotWorkspace(ShellWorkspace):
    """The head node's workspace: a poll that finds the head unreachable asks EC2 whether its
    instance is still there, and a head the provider ended (a spot instance reclaimed) raises
    MachineGone, which the heartbeat reports as `preempted`, not as a network fault."""

    def __init__(self, host: SSHHost, root: str, gone: Callable[[], Awaitable[str]]) -> None:
        super().__init__(host, root)
        self._gone = gone

    async def poll(self, work: str, pid: int, progress_at: int, log_at: int,
                   log_max: int = MAX_LOG_PER_POLL) -> PollResult:
        try:
            return await super().poll(work, pid, progress_at, log_at, log_max)
        except Unreachable as exc:
            why = await self._gone()
            if why:
                raise MachineGone(why) from exc
            raise


class SkyPilotCloud(MachineChecking):
    name = "skypilot"
    account = ""  # make_cloud sets it for an account of [clouds.skypilot.accounts]

    def __init__(self, settings: SkyPilotSettings, state_dir: Path, *, loop: AsyncioLoop | None = None) -> None:
        if settings.infra.split("/")[0].lower() != "aws":
            raise SpecError("clouds.skypilot.infra", f"'{settings.infra}': only aws is supported (the EC2 fallback)")
        if "{minutes}" not in settings.deadline_command:
            raise SpecError("clouds.skypilot.deadline_command", "must contain {minutes}")
        self.settings = settings
        self.cli = SkyCli(settings.sky, api_server=settings.api_server, timeout_s=settings.cli_timeout_s)
        self.ec2 = Ec2(endpoint_url=settings.ec2_endpoint, call_timeout_s=settings.ec2_timeout_s)
        default = Path(state_dir) / "skypilot" / "known_hosts"
        self.known_hosts = Path(settings.known_hosts).expanduser() if settings.known_hosts else default
        self._loop = loop
        self._hosts: dict[str, SSHHost] = {}
        self._regions: dict[str, str] = {}  # cluster -> region, for deletes by name
        self._seen_regions: set[str] = set()
        self._prices: dict[tuple[str, str], tuple[float, float]] = {}  # (gpu, region) -> (usd/h, when)
        self.teardown = Teardown(self.cli, self.ec2, poll_s=settings.poll_s, down_timeout_s=settings.down_timeout_s)

    # --- offers ----------------------------------------------------------------------------------

    def _regions_for(self, candidate: CandidateSpec, index: int) -> list[str]:
        regions = candidate.regions or [r for r in [_region_of(self.settings.infra)] if r]
        if not regions:
            raise SpecError(f"candidates[{index}].regions",
                            "skypilot needs a region per placement (or infra = 'aws/<region>')")
        return regions

    async def _price(self, gpu: str, region: str) -> float | None:
        if not gpu:  # SkyPilot picks a CPU instance: its catalog has no GPU row to price it by
            return None
        key = (gpu, region)
        cached = self._prices.get(key)
        if cached is not None and time.monotonic() - cached[1] < PRICE_TTL_S:
            return cached[0]
        try:
            name = gpu_class(gpu)
            price = await self.cli.hourly_price(GPUS.get(name, name), f"aws/{region}", spot=self.settings.use_spot,
                                                count=gpu_count(gpu))
        except (SkyHung, SkyFailed) as exc:
            logger.warning("skypilot: no price for {} in {}: {}", gpu, region, exc)
            return None
        if price is not None:
            self._prices[key] = (price, time.monotonic())
        return price

    def machine_check(self, offer: Offer) -> MachineCheck:
        """The head node is checked before the job: its GPUs (unless `check_gpu = false`) and clock."""
        return MachineCheck(gpu=offer.gpu, check_gpu=self.settings.check_gpu and bool(offer.gpu))

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        found = []
        fallback = self.settings.fallback_hourly_usd
        for region in self._regions_for(candidate, index):
            price = await self._price(candidate.gpu or "", region)
            if price is None and fallback is None:
                logger.warning("skypilot: SkyPilot gives no price for {} in {}: not offered (set "
                               "clouds.skypilot.fallback_hourly_usd to meter it at a price of yours)",
                               candidate.gpu or "a machine without GPU", region)
                continue
            if price is None:
                logger.warning("skypilot: SkyPilot gives no price for {} in {}: metered at fallback_hourly_usd "
                               "${:.3f}/h", candidate.gpu or "a machine without GPU", region, fallback)
                price = fallback
            assert price is not None
            if candidate.max_hourly_usd is not None and price > candidate.max_hourly_usd:
                continue
            found.append(Offer(cloud=self.name, region=region, gpu=candidate.gpu, hourly_usd=price, candidate=index,
                               image=candidate.image or self.settings.image_id))
        return sorted(found, key=lambda o: o.hourly_usd)

    # --- launch ----------------------------------------------------------------------------------

    def _launch_args(self, offer: Offer, name: str, deadline: float) -> list[str]:
        s = self.settings
        zone = s.infra.split("/")[2:3]
        infra = "/".join(["aws", offer.region, *(zone if offer.region == _region_of(s.infra) else [])])
        args = ["launch", "--async", "-y", "-c", name, "--down", "-i", str(s.idle_minutes), "--infra", infra,
                "--use-spot" if s.use_spot else "--no-use-spot"]
        if offer.gpu:  # `A100:8`: eight on the one node
            name = gpu_class(offer.gpu)
            args += ["--gpus", f"{GPUS.get(name, name)}:{gpu_count(offer.gpu)}"]
        if offer.image:
            args += ["--image-id", offer.image]
        return [*args, hold_command(deadline)]

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        region = offer.region
        self._regions[name] = region
        self._seen_regions.add(region)
        log = logger.bind(cloud=self.name, machine=name)
        try:
            res = await self.cli.run(*self._launch_args(offer, name, deadline))
        except SkyHung as exc:  # it may have been submitted: stop it, then the lease reconciles by name
            await self.teardown.stop_launches(name)
            raise LaunchAmbiguous(f"skypilot: {exc}") from exc
        except trio.Cancelled:
            await self.teardown.stop_launches(name)
            raise
        request = submitted(res.out + res.err)
        if res.code != 0 and request is None:  # refused before it was submitted (the CLI validates first)
            raise LaunchRefused(f"skypilot: sky launch exited {res.code}: {res.tail()}", code=Code.LAUNCH_FAILED)
        if request is None:
            await self.teardown.stop_launches(name)
            raise LaunchAmbiguous(f"skypilot: sky launch said no request id: {res.tail()}")
        log.info("skypilot: {} launching in {} (request {})", name, region, request[:8])
        status = await self._follow(name, request)
        self.teardown.settled.add(name)
        if status != "SUCCEEDED":
            detail = f"skypilot: launch of {name} in {region} {status.lower()}"
            code = Code.LAUNCH_FAILED
            if status == "FAILED":
                try:
                    text = await self.cli.logs(request)
                except SkyHung:
                    text = ""
                code = classify(text)
                detail += ": " + _last_error(text)
            await self._fail_launched(name, region, code, detail)
        return await self._launched(offer, name, deadline)

    async def _follow(self, name: str, request: str) -> str:
        """Poll the launch request until it finishes; its final status. Past `launch_timeout_s` it is
        cancelled and LaunchAmbiguous raised; a cancel of ours cancels it too."""
        end = trio.current_time() + self.settings.launch_timeout_s
        try:
            while trio.current_time() < end:
                try:
                    r = await self.cli.request(request)
                except (SkyHung, SkyFailed) as exc:  # not read this time: the launch's own limit still holds
                    logger.bind(machine=name).warning("skypilot: request {} not read: {}", request[:8], exc)
                    r = None
                if r is not None and r.status not in ACTIVE:
                    return r.status
                await trio.sleep(self.settings.poll_s)
        except trio.Cancelled:
            await self.teardown.stop_launches(name, request)
            raise
        await self.teardown.stop_launches(name, request)
        raise LaunchAmbiguous(f"skypilot: the launch of {name} did not finish within "
                              f"{self.settings.launch_timeout_s:.0f} s (cancelled)")

    async def _fail_launched(self, name: str, region: str, code: Code, detail: str) -> NoReturn:
        """A launch that failed after it may have made something: delete, then raise clean only if
        the delete is proven, else ambiguous (the lease reconciles by name)."""
        limit = self.settings.down_timeout_s + 60  # shielded from the lease's own limit: bounded here
        try:
            with trio.CancelScope(shield=True), trio.fail_after(limit):
                await self.delete(name, f"{region}/")
        except DeleteUnconfirmed as exc:
            raise LaunchAmbiguous(f"{detail}; not yet torn down: {exc}") from exc
        except trio.TooSlowError as exc:
            raise LaunchAmbiguous(f"{detail}; not torn down within {limit:.0f} s") from exc
        raise LaunchRefused(detail + " (torn down)", code=code)

    async def _launched(self, offer: Offer, name: str, deadline: float) -> Machine:
        """The cluster is up: its head's address, and each instance set to terminate on shutdown."""
        region = offer.region
        try:
            address = await self.cli.head_ip(name)
            instances = await self.ec2.cluster_instances(region, name, ["pending", "running"])
            if not instances:
                raise Ec2Error(f"no instance tagged with cluster {name} in {region}")
            for i in instances:
                behavior = await self.ec2.terminate_on_shutdown(i)
                if behavior != "terminate":
                    raise Ec2Error(f"{i.id} still {behavior or 'unknown'} on shutdown")
        except (SkyHung, SkyFailed, Ec2Error) as exc:
            await self._fail_launched(name, region, Code.LAUNCH_FAILED,
                                      f"skypilot: {name} came up but is not used: {exc}")
        logger.bind(machine=name).info("skypilot: {} is up at {} ({}), terminates on shutdown", name, address,
                                       ", ".join(i.id for i in instances))
        return Machine(
            cloud=self.name, id=f"{region}/{instances[0].id}", name=name, region=region, gpu=offer.gpu,
            hourly_usd=offer.hourly_usd, deadline=deadline, created_at=time.time(), address=address,
            root=self.settings.root,
        )

    # --- connect ---------------------------------------------------------------------------------

    async def connect(self, machine: Machine) -> Workspace:
        s = self.settings
        if machine.name not in self._hosts:
            self._hosts[machine.name] = SSHHost(
                f"skypilot:{machine.name}", machine.address, port=s.ssh_port, user=s.ssh_user, key=s.ssh_key or None,
                known_hosts=self.known_hosts / machine.name, connect_timeout_s=s.connect_timeout_s, loop=self._loop,
            )
        host = self._hosts[machine.name]
        ws = SkyPilotWorkspace(host, machine.root or s.root, lambda: self._taken_back(machine))
        await ws.prepare()
        # a minute early: the shutdown itself takes a moment, and a minute is its resolution
        minutes = max(1, math.floor((machine.deadline - time.time()) / 60) - 1)
        res = await host.run(s.deadline_command.replace("{minutes}", str(minutes)), timeout=60)
        if res.exit_code != 0:
            raise Refused(Code.LAUNCH_FAILED, f"skypilot: {machine.name} refused its deadline shutdown "
                                              f"(exit {res.exit_code}): {res.error_text()}")
        logger.bind(machine=machine.name).info("skypilot: {} shuts down in {} min", machine.name, minutes)
        return ws

    async def _taken_back(self, machine: Machine) -> str:
        """Why the machine's head instance is gone when EC2 says it ended; "" when it runs or when
        EC2 cannot tell (then the failure stays a network one)."""
        region, _, instance = machine.id.partition("/")
        if not instance:
            return ""
        try:
            state = await self.ec2.state(Ec2Instance(instance, "", machine.name, region))
        except Ec2Error:
            return ""
        if state in ("pending", "running"):
            return ""
        what = "spot instance reclaimed" if self.settings.use_spot else "instance ended by its provider"
        return f"skypilot: {machine.name}: {what} ({instance} is {state})"

    # --- delete ----------------------------------------------------------------------------------

    def _delete_regions(self, name: str, machine_id: str) -> list[str]:
        region = machine_id.split("/", 1)[0] if "/" in machine_id else self._regions.get(name, "")
        if region:
            return [region]
        return sorted(self._sweep_regions())

    async def delete(self, name: str, machine_id: str = "") -> None:
        host = self._hosts.pop(name, None)
        if host is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await host.aclose()
        await self.teardown.delete(name, self._delete_regions(name, machine_id))
        self._regions.pop(name, None)
        (self.known_hosts / name).unlink(missing_ok=True)  # a cluster's pin dies with it

    # --- sweep -----------------------------------------------------------------------------------

    def _sweep_regions(self) -> set[str]:
        found = {*self.settings.regions, *self._seen_regions}
        if _region_of(self.settings.infra):
            found.add(_region_of(self.settings.infra))
        return found

    async def list_ours(self, prefix: str) -> list[Machine]:
        found: dict[str, Machine] = {}
        failures = []
        try:
            for c in await self.cli.clusters(all_users=True):
                if c.name.startswith(prefix):
                    found[c.name] = self._listed(c.name, c.region or self._regions.get(c.name, ""), "")
        except (SkyHung, SkyFailed) as exc:
            failures.append(f"sky status: {exc}")
        for region in sorted(self._sweep_regions()):
            try:
                instances = await self.ec2.instances(region, [f"{prefix}*"], LIVE)
            except Ec2Error as exc:
                failures.append(str(exc))
                continue
            for i in instances:
                if i.name not in found:
                    found[i.name] = self._listed(i.name, region, i.id)
        if failures and not found:
            raise SkyFailed("; ".join(failures))
        for f in failures:
            logger.warning("skypilot: listing machines: {}", f)
        return list(found.values())

    def _listed(self, name: str, region: str, instance: str) -> Machine:
        parsed = parse_name(name)
        return Machine(cloud=self.name, id=f"{region}/{instance}" if region else "", name=name, region=region,
                       deadline=float(parsed.deadline) if parsed else 0.0, account=self.account)

    async def aclose(self) -> None:
        hosts = list(self._hosts.values())
        self._hosts.clear()
        with trio.CancelScope(shield=True):
            for h in hosts:
                await h.aclose()


def _last_error(log: str) -> str:
    """The last line of a request's log that names an exception (else its last line)."""
    lines = [x.strip() for x in log.splitlines() if x.strip()]
    errors = [x for x in lines if "Error" in x or "Exception" in x]
    return (errors or lines or ["no log"])[-1][-300:]

