"""What every rented cloud does the same way, whatever its API: wait for a machine to be ready,
connect to it over SSH, delete it and prove it gone, find it again by name.

A provider module (runpod.py, lambdacloud.py, hyperstack.py) subclasses `RentedCloud` and answers
five questions in its vendor's words: `offers`, `_create` (a machine named so; its id, or raises
`LaunchRefused` / `LaunchAmbiguous`), `_read` (one machine as a `Seen`, None once the provider
says it is gone), `_list` (every machine the account holds) and `_delete_call` (ask for the
deletion; proving it is this module's work). Optionally `_deadline_script`: what the machine runs
to end itself at its deadline.

Rules kept here for all of them:
- Launch waits for readiness, polling `_read`; a machine that is not ready within the settings'
  `launch_timeout_s` raises `LaunchAmbiguous(code=launch_failed)`: the lease then deletes it by
  name. A machine that fails (`Seen.state == "failed"`) is the vendor's `failed_code`.
- Ready is what we can reach, not what the API says: `connect` to a machine this process
  launched keeps trying SSH with backoff
  (refused, reset, timed out, no route, no banner yet, a host key not yet made) until
  `launch_timeout_s` from the create; only our key refused, or that time passing, ends it
  (`Refused(LAUNCH_FAILED)` / `Unreachable`: the lease says launch_failed and deletes it).
- A machine not found right after its create is waited for (`listing_lag_s`): listings lag; one
  still not found then is ambiguous (`launch_failed`), deleted by name, never taken as not made.
- Delete is proven by a read: `_read` must say gone. Deleting by name alone (an ambiguous create)
  lists, and lists again for `listing_lag_s`, before it concludes nothing was made.
- A host call that cannot reach the machine asks the provider: a machine that is gone raises
  `MachineGone` (`preempted`), not `Unreachable`.
- Before the job, the lease checks the machine (`machine_check`: nvidia-smi lists the offer's GPUs,
  the clock within 60 s; clouds/verify.py); `check_gpu = false` keeps only the clock check.
- Each machine's host key is pinned at its first successful login, in a known-hosts file of its
  own (a new machine may well reuse an address and port of an old one).
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar

import msgspec
import trio

from actor_run.protocols.clouds.capabilities import Booting, Cataloged, LaunchChecking, MachineChecking, SSHLogin
from actor_run.protocols.clouds.gpus import gpu_names
from actor_run.protocols.clouds.http import NoAnswer, RateLimited
from actor_run.protocols.clouds.verify import MachineCheck
from actor_run.protocols.failures import (
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchRefused,
    MachineGone,
    SpecError,
    Unreachable,
)
from actor_run.protocols.hosts import scripts
from actor_run.protocols.hosts.base import RunResult
from actor_run.protocols.hosts.workspace import ShellWorkspace, Workspace
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.names import parse_name
from actor_run.protocols.redact import MIN_KEY_LENGTH
from actor_run.protocols.specs import CandidateSpec

if TYPE_CHECKING:  # asyncssh (about 0.3 s of CPU) loads with a machine's first host: none leased, none loaded
    from actor_run.protocols.hosts.ssh import SSHHost

Positive = Annotated[float, msgspec.Meta(gt=0)]


T = TypeVar("T")

class RentedSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[clouds.<name>]` fields every rented cloud has (a provider's struct adds its own)."""

    api_url: str = ""  # default: the vendor's
    api_key_env: str = ""  # default: the vendor's (RUNPOD_API_KEY, ...)
    ssh_key: str = "~/.ssh/id_ed25519"  # a private key file; its public half (<file>.pub) goes to the machine
    root: str = "~/.actor-run"  # the folder for actor-run on the machine
    known_hosts: str = ""  # default: <state_dir>/<cloud>/known_hosts.d/<machine name>
    timeout_s: Positive = 30.0  # one HTTP call
    # create to ready; past it the machine is `launch_failed` and deleted. Below policy.setup_grace_s
    # (600 by default), which bounds the same wait from the lease's side and says ambiguous_create
    launch_timeout_s: Positive = 540.0
    poll_s: Positive = 3.0  # readiness and deletion reads
    listing_lag_s: Annotated[float, msgspec.Meta(ge=0)] = 20.0  # how long a new machine may be missing from reads
    delete_wait_s: Positive = 120.0  # delete to gone, before DeleteUnconfirmed (the lease retries)
    connect_timeout_s: Positive = 20.0  # one SSH try (the readiness wait is launch_timeout_s)
    # before the job: nvidia-smi must list the GPUs asked (false: an image without nvidia-smi; the
    # clock is checked all the same). clouds/verify.py
    check_gpu: bool = True


class VMSettings(RentedSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A rented VM (Lambda, Hyperstack): a login user, port 22 on its own IP, and an OS shutdown
    at its deadline (the provider has no means of its own; the sweep is the other backstop)."""

    user: str = "ubuntu"
    ssh_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 22
    shutdown_command: str = "sudo -n shutdown -h now"


def shutdown_script(deadline: float, command: str) -> str:
    """POSIX sh that waits for the deadline, then runs `command` (the OS shutdown)."""
    return (
        "#!/bin/sh\n# actor-run: this machine shuts down at its deadline\n"
        f"now=$(date +%s); [ {int(deadline)} -gt \"$now\" ] && sleep $(({int(deadline)} - now))\n"
        f"{command}\n"
    )


def vendor_name(name: str, limit: int) -> str:
    """`name` as a vendor whose names are at most `limit` long takes it: unchanged when it fits,
    else cut and ended with 8 hex digits of its hash (still unique; the full name rides in a tag)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9]}-{digest}"


class Seen(msgspec.Struct, frozen=True, kw_only=True):
    """One machine as the provider describes it, in our words."""

    id: str
    name: str
    state: Literal["pending", "ready", "failed", "gone"]
    detail: str = ""  # the vendor's own status word(s)
    address: str = ""
    port: int = 22
    user: str = "root"
    hourly_usd: float = 0.0
    region: str = ""
    gpu: str = ""
    created_at: float = 0.0
    # the provider took it from us (a Vast instance outbid, a Shadeform spot instance reclaimed, a
    # host gone offline) though a read does not say gone yet: a host call that fails then is
    # `preempted`, and its deletion is still proven by a read that says gone
    taken: bool = False


def api_key(cloud: str, env_var: str) -> str:
    """The API key from the environment variable the settings name; SpecError names the variable."""
    value = os.environ.get(env_var, "").strip()
    if not value:
        raise SpecError(f"clouds.{cloud}.api_key_env", f"set the environment variable {env_var} to your "
                        f"{cloud} API key")
    if len(value) < MIN_KEY_LENGTH:  # no provider issues one: a placeholder, and too short to mask
        raise SpecError(f"clouds.{cloud}.api_key_env", f"the value of {env_var} is {len(value)} characters: "
                        f"too short to be an API key (at least {MIN_KEY_LENGTH})")
    return value


def public_key(cloud: str, ssh_key: str) -> str:
    """The public half of the settings' `ssh_key` (its .pub file): what the provider puts on the machine."""
    path = Path(ssh_key).expanduser()
    pub = path.with_name(path.name + ".pub")
    try:
        text = pub.read_text().strip()
    except OSError as exc:
        raise SpecError(f"clouds.{cloud}.ssh_key", f"cannot read the public key {pub}: {exc.strerror}") from None
    if not text.startswith(("ssh-", "ecdsa-", "sk-")):
        raise SpecError(f"clouds.{cloud}.ssh_key", f"{pub} is not an OpenSSH public key")
    return text


class WatchedHost:
    """An SSH host whose unreachability is checked with the provider: a machine the provider no
    longer has raises `MachineGone` (the attempt is `preempted`, retried on a fresh machine)."""

    def __init__(self, host: SSHHost, gone: Callable[[], Awaitable[bool]]) -> None:
        self._host = host
        self._gone = gone
        self.name = host.name
        # off while the machine is coming up: an SSH try refused then is no news, and asking the
        # provider after each would spend its rate limit (a hundred machines booting at once)
        self.watching = True

    async def _check(self, exc: Unreachable) -> None:
        if not self.watching:
            return
        try:
            gone = await self._gone()
        except (NoAnswer, RateLimited, LaunchRefused, DeleteUnconfirmed):
            return  # the provider did not say: the host's own failure stands
        if gone:
            raise MachineGone(f"{self.name}: the provider no longer has this machine ({exc})") from exc

    async def run(self, script: str, *, stdin: bytes = b"", timeout: float = 60.0) -> RunResult:
        try:
            return await self._host.run(script, stdin=stdin, timeout=timeout)
        except Unreachable as exc:
            await self._check(exc)
            raise

    async def put(self, local: Path, remote: str) -> int:
        try:
            return await self._host.put(local, remote)
        except Unreachable as exc:
            await self._check(exc)
            raise

    async def get_tar(self, remote_dir: str, names: list[str], local_tar: Path) -> int:
        try:
            return await self._host.get_tar(remote_dir, names, local_tar)
        except Unreachable as exc:
            await self._check(exc)
            raise

    async def aclose(self) -> None:
        await self._host.aclose()


class RentedCloud(Booting, Cataloged, LaunchChecking, SSHLogin, MachineChecking):
    """The shared half of a rented cloud (see the module docstring); subclasses speak the API."""

    name = "rented"
    account = ""  # make_cloud sets it for an account of [clouds.<name>.accounts]
    failed_code = Code.LAUNCH_FAILED  # what a machine that failed to come up means at this vendor
    boots = True  # its machines boot: the lease shows their stages (booting, waiting for ssh)
    regions: frozenset[str] | None = None  # the vendor's region names (None: not checked)

    def __init__(self, settings: RentedSettings, state_dir: Path) -> None:
        self.settings = settings
        self.dir = Path(state_dir) / self.name
        self._ids: dict[str, str] = {}  # name -> id, for machines this process launched or found
        self._created: dict[str, float] = {}  # name -> trio time its create went out (for connect's bound)

    @property
    def gpu_names(self) -> frozenset[str]:
        """What a candidate's `gpu` may say here: our names and the vendor's ids."""
        return gpu_names(self.name)

    @property
    def region_names(self) -> frozenset[str] | None:
        """What a candidate's `regions` may say here (None: not checked)."""
        return self.regions

    @functools.cached_property
    def _public_key(self) -> str:
        """The public half of `ssh_key`, read when first needed: the read-only calls (`clouds check`,
        `offers`, a sweep) need no local key; `check_launchable` reads it before anything starts."""
        return public_key(self.name, self.settings.ssh_key)

    def machine_check(self, offer: Offer) -> MachineCheck:
        """What the lease checks on a new machine before the job: its GPUs (the offer's shape, unless
        `check_gpu = false`) and its clock."""
        return MachineCheck(gpu=offer.gpu, check_gpu=self.settings.check_gpu and bool(offer.gpu))

    def check_launchable(self) -> None:
        """Raise SpecError (naming `ssh_key`) when this cloud could not launch a machine we can reach."""
        _ = self._public_key

    # --- what a provider module answers -----------------------------------------------------------

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        raise NotImplementedError

    async def _create(self, offer: Offer, name: str, deadline: float) -> str:
        raise NotImplementedError

    async def _read(self, machine_id: str) -> Seen | None:
        raise NotImplementedError

    async def _list(self) -> list[Seen]:
        raise NotImplementedError

    async def _delete_call(self, machine_id: str) -> None:
        """Ask for the deletion; a 404 is fine (gone already); raise DeleteUnconfirmed only when the
        provider refused in a way a read cannot settle (a 401)."""
        raise NotImplementedError

    def _deadline_script(self, machine: Machine) -> str:
        """POSIX sh the machine runs detached to end itself at `machine.deadline` ('' for none)."""
        return ""

    async def aclose(self) -> None:
        pass

    # --- the shared half ------------------------------------------------------------------------

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        self._created[name] = trio.current_time()
        machine_id = await self._create(offer, name, deadline)
        self._ids[name] = machine_id
        s = self.settings
        started = trio.current_time()
        log = logger.bind(cloud=self.name)
        seen: Seen | None = None
        while True:
            try:
                seen = await self._read(machine_id)
            except (NoAnswer, RateLimited) as exc:  # a read failing is no verdict: read again
                log.info("{}: reading {} failed: {}", self.name, name, exc)
                seen = Seen(id=machine_id, name=name, state="pending", detail=str(exc))
            waited = trio.current_time() - started
            if seen is None and waited > s.listing_lag_s:
                # made, then not seen for longer than reads may lag: the place could not keep it, or
                # its reads lag longer still (a Vast instance reads null for a while after its
                # create). Ambiguous, never a clean refusal: the lease deletes it by name
                raise LaunchAmbiguous(f"{self.name}: {name} ({machine_id}) not seen since its create "
                                      f"(listing_lag_s = {s.listing_lag_s:g} s)", code=self.failed_code)
            if seen is not None and seen.state == "ready":
                break
            if seen is not None and seen.state in ("failed", "gone"):
                # it exists (billing, maybe) until deleted: ambiguous, so the lease deletes it by name
                raise LaunchAmbiguous(f"{self.name}: {name} did not come up: {seen.detail}", code=self.failed_code)
            if waited > s.launch_timeout_s:
                detail = seen.detail if seen is not None else "not listed yet"
                raise LaunchAmbiguous(f"{self.name}: {name} not ready within {s.launch_timeout_s:.0f} s "
                                      f"({detail})", code=Code.LAUNCH_FAILED)
            await trio.sleep(s.poll_s)
        return Machine(
            cloud=self.name, id=machine_id, name=name, region=seen.region or offer.region,
            gpu=offer.gpu or seen.gpu, hourly_usd=seen.hourly_usd or offer.hourly_usd, deadline=deadline,
            created_at=seen.created_at or time.time(), address=seen.address, port=seen.port, user=seen.user,
            root=s.root, account=self.account, cache=offer.cache_path if offer.cache else "",
        )

    def _known_hosts(self, name: str) -> Path:
        if self.settings.known_hosts:
            return Path(self.settings.known_hosts).expanduser()
        return self.dir / "known_hosts.d" / name

    def login(self, machine: Machine) -> list[str]:
        """The OpenSSH client's arguments for a shell on `machine`, held to its pinned host key
        (`actor-run ssh`); nothing is connected here."""
        from actor_run.protocols.hosts.ssh import SSHHost

        ssh = SSHHost(f"{self.name}:{machine.name}", machine.address, port=machine.port or 22, user=machine.user,
                      key=self.settings.ssh_key, known_hosts=self._known_hosts(machine.name),
                      connect_timeout_s=self.settings.connect_timeout_s)
        return ssh.ssh_client_args()

    async def connect(self, machine: Machine) -> Workspace:
        from actor_run.protocols.hosts.ssh import SSHHost

        known = self._known_hosts(machine.name)
        known.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        s = self.settings
        ssh = SSHHost(f"{self.name}:{machine.name}", machine.address, port=machine.port or 22,
                      user=machine.user, key=s.ssh_key, known_hosts=known, connect_timeout_s=s.connect_timeout_s)
        self._ids.setdefault(machine.name, machine.id)

        async def gone() -> bool:
            return await self._is_lost(machine.id)

        watched = WatchedHost(ssh, gone)
        ws = ShellWorkspace(watched, machine.root or s.root)
        created = self._created.pop(machine.name, None)
        try:
            if created is not None:  # made by this process: it may still be booting
                watched.watching = False
                await self._wait_ssh(ws, machine, created + s.launch_timeout_s)
                watched.watching = True
            else:  # one that was up before (a resume, a sweep reading its stamp): one try says
                await ws.prepare()
            script = self._deadline_script(machine)
            if script:
                await ws.host.run(_detached(ws.root, script), timeout=30)
        except BaseException:
            with trio.CancelScope(shield=True):
                await ws.aclose()
            raise
        return ws

    async def _wait_ssh(self, ws: ShellWorkspace, machine: Machine, until: float) -> None:
        """Prepare the workspace, trying again with backoff while SSH does not answer (the guest is
        booting, its sshd not up, the firewall rule not in yet) until `until` (trio time)."""
        log = logger.bind(cloud=self.name)
        pause, tries = 0.25, 0
        last = Unreachable(f"{self.name}: {machine.name}: no SSH try ended in time")
        while True:
            tries += 1
            with trio.move_on_at(until):
                try:
                    await ws.prepare()
                    if tries > 1:
                        log.info("{}: {} answered SSH at try {}", self.name, machine.name, tries)
                    return
                except Unreachable as exc:
                    last = exc
            if trio.current_time() + pause >= until:
                raise Unreachable(f"{self.name}: {machine.name} ({machine.address}:{machine.port}) did not answer "
                                  f"SSH within launch_timeout_s = {self.settings.launch_timeout_s:g} s of its create "
                                  f"({tries} tries; the last: {last})") from last
            log.debug("{}: {} not answering SSH yet ({}); again in {:.2f} s", self.name, machine.name, last, pause)
            await trio.sleep(pause)
            pause = min(pause * 2, 4.0)

    async def _is_gone(self, machine_id: str) -> bool:
        seen = await self._read(machine_id)
        return seen is None or seen.state == "gone"

    async def _patiently(self, what: str, call: Callable[[], Awaitable[T]], end: float) -> T:
        """`call()`, asked again with backoff (0.5 s doubling to 8 s) while the provider fails for a
        while (a 5xx, no answer, a 429 past its waits) until trio time `end`: a transient error
        while proving a machine gone is no verdict. The last error goes on up past `end`."""
        pause = 0.5
        while True:
            try:
                return await call()
            except (NoAnswer, RateLimited) as exc:
                if trio.current_time() + pause >= end:
                    raise
                logger.bind(cloud=self.name).info("{}: {} failed ({}); again in {:.1f} s", self.name, what, exc, pause)
            await trio.sleep(pause)
            pause = min(pause * 2, 8.0)

    async def _is_lost(self, machine_id: str) -> bool:
        """Whether a machine we could not reach is no longer ours to use: gone, or taken (`Seen.taken`)."""
        seen = await self._read(machine_id)
        return seen is None or seen.state == "gone" or seen.taken

    async def _find(self, name: str) -> list[str]:
        """The ids of every machine named `name`; a listing may lag a create, so an empty answer is
        asked again until `listing_lag_s` has passed."""
        end = trio.current_time() + self.settings.listing_lag_s
        while True:
            ids = [m.id for m in await self._list() if m.name == name and m.state != "gone"]
            if ids or trio.current_time() >= end:
                return ids
            await trio.sleep(min(self.settings.poll_s, max(0.0, end - trio.current_time())))

    async def delete(self, name: str, machine_id: str = "") -> None:
        """Delete `name` and prove it gone by a read. A transient error of the provider (a 5xx, no
        answer, a 429) while finding or reading it is asked again with backoff for up to
        `delete_wait_s`; only then is it DeleteUnconfirmed (the machine stays in the ledger for
        the lease's retries and `actor-run sweep`)."""
        ids = [machine_id] if machine_id else ([self._ids[name]] if name in self._ids else [])
        end = trio.current_time() + self.settings.delete_wait_s
        try:
            if not ids:  # an ambiguous create: adopt what it made, by name
                ids = await self._patiently(f"listing machines to find {name}", lambda: self._find(name), end)
            for mid in ids:
                await self._delete_one(name, mid, end)
        except (NoAnswer, RateLimited) as exc:
            raise DeleteUnconfirmed(f"{self.name}: {name}: {exc}") from exc
        self._ids.pop(name, None)
        self._created.pop(name, None)
        with_known = self._known_hosts(name)
        if not self.settings.known_hosts:
            with_known.unlink(missing_ok=True)

    async def _delete_one(self, name: str, machine_id: str, end: float) -> None:
        asked = False
        while True:
            if not asked:
                try:
                    await self._delete_call(machine_id)
                    asked = True
                except NoAnswer as exc:  # a 5xx or no answer: did it work? the read says
                    logger.bind(cloud=self.name).info("{}: delete of {} unanswered: {}", self.name, name, exc)
            if await self._patiently(f"reading {name} to prove it gone", lambda: self._is_gone(machine_id), end):
                return
            if trio.current_time() >= end:
                raise DeleteUnconfirmed(f"{self.name}: {name} ({machine_id}) still there "
                                        f"{self.settings.delete_wait_s:.0f} s after its delete")
            await trio.sleep(self.settings.poll_s)  # a delete that failed is asked again next round

    async def list_ours(self, prefix: str) -> list[Machine]:
        found = []
        for m in await self._list():
            if not m.name.startswith(prefix) or m.state == "gone":
                continue
            parsed = parse_name(m.name)
            self._ids.setdefault(m.name, m.id)
            found.append(Machine(
                cloud=self.name, id=m.id, name=m.name, region=m.region, gpu=m.gpu, hourly_usd=m.hourly_usd,
                deadline=float(parsed.deadline) if parsed else 0.0, created_at=m.created_at,
                address=m.address, port=m.port, user=m.user, root=self.settings.root, account=self.account,
            ))
        return found


def _detached(root: str, script: str) -> str:
    """Write `script` to <root>/deadline.sh and start it in a session of its own (it outlives us)."""
    path = f"{root}/deadline.sh"
    return (
        f"cat > {scripts.q(path)} <<'ACTOR_RUN_DEADLINE'\n{script}\nACTOR_RUN_DEADLINE\n"
        f"chmod 700 {scripts.q(path)}\n"
        f"pkill -f {scripts.q(path)} 2>/dev/null\n"
        f"setsid nohup sh {scripts.q(path)} </dev/null >/dev/null 2>&1 &\n"
        "exit 0\n"
    )


__all__ = [
    "RentedCloud", "RentedSettings", "Seen", "VMSettings", "WatchedHost", "api_key", "public_key",
    "shutdown_script", "vendor_name",
]
