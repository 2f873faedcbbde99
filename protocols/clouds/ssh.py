"""The `ssh` cloud: the user's own machines, reached over SSH. Nothing is rented or paid for; a
"machine" is one of a host's slots, claimed for one attempt.

Layout under a host's private root (the same root every controller uses, so inputs and code
published there once serve every later attempt)::

    slots/<i>/machine           slot i is taken; the file holds the machine's name
    slots/.claim-<name>/        a claim being made (renamed onto slots/<i>, never seen half-made)
    work/<name>/<job>/<seed>/   the attempts of that machine (see hosts/workspace.py)
    code/, objects/             published code and inputs, shared by the host's machines

A claim is exclusive and visible to every controller through the host itself: renaming a folder
onto `slots/<i>` fails while another machine's claim is there. Deleting a machine stops its jobs,
removes `work/<name>` and then frees its slot; nothing else on the host is touched.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import msgspec
import trio

from actor_run.protocols.clouds.capabilities import MachineChecking, SSHLogin
from actor_run.protocols.clouds.gpus import ShapeError, gpu_class, gpu_count, parse_shape, shape
from actor_run.protocols.clouds.verify import MachineCheck
from actor_run.protocols.failures import (
    Code,
    DeleteUnconfirmed,
    LaunchAmbiguous,
    LaunchRefused,
    Refused,
    SpecError,
    Unreachable,
)
from actor_run.protocols.hosts import scripts
from actor_run.protocols.hosts.aio import AsyncioLoop
from actor_run.protocols.hosts.ssh import SSHHost
from actor_run.protocols.hosts.workspace import ShellWorkspace, Workspace
from actor_run.protocols.logs import logger
from actor_run.protocols.messages import Machine, Offer
from actor_run.protocols.names import parse_name
from actor_run.protocols.specs import CandidateSpec, check_name_part

q = scripts.q


class SSHHostSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    address: str
    port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 22
    user: str = ""  # default: the current user (as asyncssh and ~/.ssh/config decide)
    key: str | None = None  # default: the agent and the keys of ~/.ssh
    passphrase: str | None = None  # of an encrypted `key`: a secret, for the user config, not a batch file
    root: str = "~/.actor-run"  # the private folder on the host where everything goes
    slots: Annotated[int, msgspec.Meta(ge=1)] = 1  # how many attempts it takes at once
    connect_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    # the GPUs it has ("A100:4"): a candidate asking for more, or another class, is not offered it;
    # `slots` may not exceed the count; each attempt's machine is checked (nvidia-smi, the clock)
    gpus: str = ""
    check_gpu: bool = True  # false: only the clock is checked (a host without nvidia-smi)


class SSHSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    hosts: dict[str, SSHHostSettings] = msgspec.field(default_factory=dict)
    known_hosts: str = ""  # default: <state_dir>/ssh/known_hosts, our own file (first sight pins)

    def __post_init__(self) -> None:
        """A host's name is the first part of its machines' ids (`<host>/<slot>`, split on `/`):
        SpecError for one with a `/`, a space or a control character (`gpu/1` took a slot that was
        never freed)."""
        for name, cfg in self.hosts.items():
            check_name_part("clouds.ssh.hosts", name)
            for field in ("address", "user", "root"):
                if any(ord(ch) < 32 or ord(ch) == 127 for ch in getattr(cfg, field)):
                    raise SpecError(f"clouds.ssh.hosts.{name}.{field}", "contains a control character")


# the root as the host spells it, resolved without creating it: prints nothing if it does not exist
_FIND_ROOT = r"""r=$1
case "$r" in "~") r=$HOME;; "~/"*) r="$HOME/${r#\~/}";; esac
[ -e "$r" ] || [ -L "$r" ] || exit 0
"""


def _claim(root: str, name: str, slots: int) -> str:
    """Take a free slot for `name` (or the one it already holds); prints `slot <i>` or `full`."""
    return (
        f"root={q(root)} name={q(name)}\n"
        'mkdir -p "$root/slots" || exit 3\n'
        'for s in "$root"/slots/[0-9]*; do\n'
        '  [ "$(cat "$s/machine" 2>/dev/null)" = "$name" ] && { echo "slot ${s##*/}"; exit 0; }\n'
        "done\n"
        'c="$root/slots/.claim-$name"\n'
        'rm -rf "$c"; mkdir "$c" && printf \'%s\\n\' "$name" > "$c/machine" || exit 3\n'
        "i=0\n"
        f"while [ $i -lt {int(slots)} ]; do\n"
        '  if [ ! -e "$root/slots/$i" ] && { mv -T "$c" "$root/slots/$i" 2>/dev/null || '
        "perl -e 'rename($ARGV[0], $ARGV[1]) or exit 1' \"$c\" \"$root/slots/$i\" 2>/dev/null; }; then\n"
        '    [ -e "$c" ] || { echo "slot $i"; exit 0; }\n'
        "  fi\n"
        "  i=$((i + 1))\n"
        "done\n"
        'rm -rf "$c"; echo full\n'
    )


def _list_slots(root: str) -> str:
    """The root (absolute) on the first line, then `<slot> <machine name>` per taken slot."""
    return (
        f"set -- {q(root)}\n" + _FIND_ROOT + 'cd "$r" && pwd -P || exit 0\n'
        'for s in slots/[0-9]*; do\n'
        '  [ -f "$s/machine" ] && printf \'%s %s\\n\' "${s##*/}" "$(cat "$s/machine")"\n'
        "done\n"
        "exit 0\n"
    )


def _attempts(root: str, name: str) -> str:
    """The root (absolute) on the first line, then the attempt folders of machine `name`."""
    return (
        f"set -- {q(root)}\n" + _FIND_ROOT + scripts.ROOT
        + f"for w in \"$(pwd -P)\"/work/{q(name)}/*/*/a*; do [ -d \"$w\" ] && echo \"$w\"; done\nexit 0\n"
    )


def _release(root: str, name: str) -> str:
    """Remove the machine's work folder, then free its slot; fails if either is still there."""
    return (
        f"root={q(root)} name={q(name)}\n"
        'w="$root/work/$name"\n'
        'if [ -e "$w" ]; then chmod -R u+w "$w" 2>/dev/null; rm -rf "$w"; fi\n'
        'for s in "$root"/slots/[0-9]* "$root/slots/.claim-$name"; do\n'
        '  [ -d "$s" ] && [ "$(cat "$s/machine" 2>/dev/null)" = "$name" ] && rm -rf "$s"\n'
        "done\n"
        '[ ! -e "$w" ] || { echo "$w is still there" >&2; exit 1; }\n'
        'for s in "$root"/slots/[0-9]*; do\n'
        '  [ "$(cat "$s/machine" 2>/dev/null)" = "$name" ] && { echo "$s is still taken" >&2; exit 1; }\n'
        "done\n"
        "exit 0\n"
    )


def _stop_watchdog(work: str) -> str:
    """Kill the attempt's watchdog and its `sleep` (its own session: the group of its pid) if that
    pid is still it (its command line names the folder)."""
    return (
        f"w={q(work)}; p=$(cat \"$w/watchdog.pid\" 2>/dev/null)\n"
        'case "$p" in ""|*[!0-9]*) ;; *) case "$(ps -ww -p "$p" -o command= 2>/dev/null)" in\n'
        '  *"$w"*) kill -s KILL -- "-$p" 2>/dev/null || kill -s KILL "$p" 2>/dev/null;; esac;; esac\n'
    )


class SSHWorkspace(ShellWorkspace):
    """A machine's workspace: its attempts live under `work/<machine name>/`, so deleting the
    machine finds them and nothing else."""

    def __init__(self, host: SSHHost, root: str, machine: str) -> None:
        super().__init__(host, root)
        self.machine = machine

    def work_dir(self, job: str, seed: int, attempt: int) -> str:
        return f"{self.root}/work/{self.machine}/{job}/{seed}/a{attempt}"

    def work_base(self) -> str:
        return f"{self.root}/work/{self.machine}"


class SSHCloud(SSHLogin, MachineChecking):
    name = "ssh"
    account = ""

    def __init__(self, settings: SSHSettings, state_dir: Path, *, loop: AsyncioLoop | None = None) -> None:
        self.settings = settings
        default = Path(state_dir) / "ssh" / "known_hosts"
        self.known_hosts = Path(settings.known_hosts).expanduser() if settings.known_hosts else default
        self._loop = loop  # the asyncio loop for SSH, for calls whose context does not carry it
        self._control: dict[str, SSHHost] = {}  # per configured host: launch, delete, list
        self._machines: dict[str, SSHHost] = {}  # per machine: its workspace's connection
        for name, cfg in settings.hosts.items():
            if not cfg.gpus:
                continue
            try:
                _, count = parse_shape(cfg.gpus)
            except ShapeError as exc:
                raise SpecError(f"clouds.ssh.hosts.{name}.gpus", str(exc)) from None
            if cfg.slots > count:
                raise SpecError(f"clouds.ssh.hosts.{name}.slots",
                                f"{cfg.slots} slots on a host with {count} GPUs ({cfg.gpus}): at most {count}")

    def _new_host(self, host: str, label: str) -> SSHHost:
        cfg = self._settings(host)
        return SSHHost(
            label, cfg.address, port=cfg.port, user=cfg.user, key=cfg.key, passphrase=cfg.passphrase,
            known_hosts=self.known_hosts,
            connect_timeout_s=cfg.connect_timeout_s, loop=self._loop,
        )

    def _settings(self, host: str) -> SSHHostSettings:
        try:
            return self.settings.hosts[host]
        except KeyError:
            raise SpecError(f"clouds.ssh.hosts.{host}", "no such host is configured") from None

    def _host(self, host: str) -> SSHHost:
        if host not in self._control:
            self._control[host] = self._new_host(host, host)
        return self._control[host]

    async def _root(self, host: str) -> str:
        """The host's root, absolute, created private if missing; Refused(GUARD) if it is not ours."""
        ws = ShellWorkspace(self._host(host), self._settings(host).root)
        return await ws.prepare()

    async def offers(self, candidate: CandidateSpec, index: int) -> list[Offer]:
        names = candidate.hosts or list(self.settings.hosts)
        for h in names:
            if h not in self.settings.hosts:
                raise SpecError(f"candidates[{index}].hosts", f"unknown host '{h}'")
        return [Offer(cloud=self.name, host=h, region=h, gpu=self._shape(h, candidate.gpu), hourly_usd=0.0,
                      candidate=index) for h in names if self._fits(h, candidate.gpu)]

    def _fits(self, host: str, gpu: str) -> bool:
        """Whether `host` has the GPUs of shape `gpu` (a host that declares none: any shape, as before)."""
        have = self.settings.hosts[host].gpus
        if not gpu or not have:
            return True
        return gpu_class(gpu).lower() == gpu_class(have).lower() and gpu_count(gpu) <= gpu_count(have)

    def _shape(self, host: str, gpu: str) -> str:
        """What an attempt on `host` gets: the candidate's shape, or one slot's share of the host's GPUs."""
        have = self.settings.hosts[host].gpus
        if gpu or not have:
            return gpu
        return shape(gpu_class(have), max(1, gpu_count(have) // self.settings.hosts[host].slots))

    def machine_check(self, offer: Offer) -> MachineCheck | None:
        """A host that declares GPUs is checked before each job (its GPUs, its clock); one that does not, not."""
        cfg = self.settings.hosts.get(offer.host or offer.region)
        if cfg is None or not cfg.gpus:
            return None
        return MachineCheck(gpu=offer.gpu or cfg.gpus, check_gpu=cfg.check_gpu)

    async def launch(self, offer: Offer, name: str, deadline: float) -> Machine:
        host = offer.host or offer.region
        cfg = self._settings(host)
        try:
            root = await self._root(host)
        except Unreachable as exc:
            raise LaunchRefused(f"ssh: {host}: {exc}", code=Code.LAUNCH_FAILED) from exc
        except Refused as exc:
            raise LaunchRefused(f"ssh: {host}: {exc}", code=exc.code) from exc
        try:
            res = await self._host(host).run(_claim(root, name, cfg.slots), timeout=60)
        except Unreachable as exc:  # the claim may have been made: reconcile by name
            raise LaunchAmbiguous(f"ssh: {host}: no answer to the slot claim: {exc}") from exc
        words = res.text().split()
        if res.exit_code != 0 or not words:
            raise LaunchRefused(f"ssh: {host}: the slot claim failed: {res.error_text()}")
        if words[0] == "full":
            raise LaunchRefused(f"ssh: {host}: all {cfg.slots} slot(s) are taken", code=Code.NO_CAPACITY)
        slot = words[-1]
        logger.bind(host=host).info("ssh: {} holds slot {} of {}", name, slot, host)
        return Machine(
            cloud=self.name, id=f"{host}/{slot}", name=name, region=host, gpu=offer.gpu, hourly_usd=0.0,
            deadline=deadline, created_at=time.time(), address=cfg.address, root=root,
        )

    def login(self, machine: Machine) -> list[str]:
        """The OpenSSH client's arguments for a shell on `machine`'s host, held to its pinned host
        key (`actor-run ssh`); nothing is connected here."""
        host = machine.id.split("/", 1)[0] or machine.region
        return self._new_host(host, f"{host}:{machine.name}").ssh_client_args()

    async def connect(self, machine: Machine) -> Workspace:
        host = machine.id.split("/", 1)[0] or machine.region
        if machine.name not in self._machines:
            self._machines[machine.name] = self._new_host(host, f"{host}:{machine.name}")
        root = machine.root or self._settings(host).root
        ws = SSHWorkspace(self._machines[machine.name], root, machine.name)
        await ws.prepare()
        return ws

    async def delete(self, name: str, machine_id: str = "") -> None:
        hosts = [machine_id.split("/", 1)[0]] if machine_id else sorted(self.settings.hosts)
        conn = self._machines.pop(name, None)
        if conn is not None:
            with trio.CancelScope(shield=True):
                await conn.aclose()
        for host in hosts:
            try:
                await self._delete_on(host, name)
            except Unreachable as exc:
                detail = f"ssh: {host} unreachable: {name} may hold a slot there ({exc})"
                raise DeleteUnconfirmed(detail) from exc
            except Refused as exc:
                raise DeleteUnconfirmed(f"ssh: {host} refused: {exc}") from exc

    async def _delete_on(self, host: str, name: str) -> None:
        h = self._host(host)
        res = await h.run(_attempts(self._settings(host).root, name), timeout=60)
        if res.exit_code == scripts.EXIT_GUARD:
            raise Refused(Code.GUARD, res.error_text())
        if res.exit_code != 0:
            raise Unreachable(f"{host}: listing the attempts of {name} exited {res.exit_code}: "
                              f"{res.error_text()}")
        lines = res.text().splitlines()
        if not lines:
            return  # no root there: nothing of ours either
        root, works = lines[0], lines[1:]
        if works:  # stop the jobs and their watchdogs first: nothing of ours outlives its folder
            stop = "".join(f"( {scripts.stop(w)})\n{_stop_watchdog(w)}" for w in works)
            await h.run(stop, timeout=30 + 10 * len(works))
        res = await h.run(_release(root, name), timeout=60)
        if res.exit_code != 0:
            raise Unreachable(f"{host}: releasing {name} exited {res.exit_code}: {res.error_text()}")

    async def list_ours(self, prefix: str) -> list[Machine]:
        found: list[Machine] = []
        for host, cfg in self.settings.hosts.items():
            try:
                res = await self._host(host).run(_list_slots(cfg.root), timeout=30)
            except (Unreachable, Refused) as exc:
                logger.bind(host=host).warning("ssh: {} skipped while listing machines: {}", host, exc)
                continue
            root, *slots = res.text().splitlines() or [""]
            for line in slots:
                slot, _, name = line.partition(" ")
                if not name.startswith(prefix):
                    continue
                parsed = parse_name(name)
                found.append(Machine(
                    cloud=self.name, id=f"{host}/{slot}", name=name, region=host,
                    deadline=float(parsed.deadline) if parsed else 0.0, address=cfg.address, root=root,
                ))
        return found

    async def aclose(self) -> None:
        hosts = [*self._machines.values(), *self._control.values()]
        self._machines.clear()
        self._control.clear()
        with trio.CancelScope(shield=True):
            for h in hosts:
                await h.aclose()
