"""SSHHost and the ssh cloud against a real OpenSSH sshd on loopback (tests/support/sshd.py).

The remote side is this computer: a "remote" path is a path under the test's tmp_path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tarfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import trio
from support.sshd import Sshd

from actor_run.protocols.clouds import parse_settings
from actor_run.protocols.clouds.ssh import SSHCloud, SSHHostSettings, SSHSettings
from actor_run.protocols.failures import Code, DeleteUnconfirmed, LaunchRefused, Refused, SpecError, Unreachable
from actor_run.protocols.hosts.aio import open_asyncio_loop
from actor_run.protocols.hosts.content import file_sha256, snapshot_code
from actor_run.protocols.hosts.ssh import SSHHost
from actor_run.protocols.hosts.workspace import Launch, ShellWorkspace, _extract
from actor_run.protocols.messages import Offer
from actor_run.protocols.names import encode_name
from actor_run.protocols.specs import CandidateSpec

T = TypeVar("T")


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    """No local `ssh` or `tar` of ours outlives a test (tests/conftest.py checks the remote side:
    processes naming tmp_path, which is where detached jobs and watchdogs run). Only what the test
    started: a session-long helper of this test process (the fake RunPod's zygote) is not its."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    # one that is just exiting (its parent reaps it a moment later) is not left behind
    _, left = psutil.wait_procs([p for p in psutil.Process().children(recursive=True) if p.pid not in before],
                                timeout=2)
    for p in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    assert not left, f"processes left behind: {left}"


def run(fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        async with open_asyncio_loop():
            return await fn()

    return trio.run(main)


def host(sshd: Sshd, tmp_path: Path, **kwargs: Any) -> SSHHost:
    return SSHHost(
        "test", sshd.address, port=sshd.port, user=sshd.user, key=str(sshd.user_key),
        known_hosts=tmp_path / "state" / "ssh" / "known_hosts", connect_timeout_s=5, **kwargs,
    )


def sessions_alive(sids: set[int]) -> list[psutil.Process]:
    alive = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(p.pid) in sids:
                alive.append(p)
    return alive


def incoming_left(root: Path) -> list[Path]:
    return [p for p in root.rglob(".incoming-*")]


# --- commands --------------------------------------------------------------------------------------


def test_commands_round_trip_on_one_channel(sshd: Sshd, tmp_path: Path) -> None:
    h = host(sshd, tmp_path)

    async def go() -> None:
        try:
            res = await h.run("echo out; echo err >&2; exit 3")
            assert (res.exit_code, res.stdout, res.stderr) == (3, b"out\n", b"err\n")
            script = 'set -e\nn=0\nwhile [ $n -lt 3 ]; do n=$((n + 1)); done\n'
            script += 'echo "n=$n args=$#"\nfalse\necho never\n'
            res = await h.run(script)
            assert (res.exit_code, res.stdout) == (1, b"n=3 args=0\n")
            blob = bytes(range(256)) * 64
            res = await h.run("cat; printf '\\000'", stdin=blob)
            assert res.stdout == blob + b"\0"
            for i in range(50):
                assert (await h.run(f"echo {i}")).stdout == f"{i}\n".encode()
            assert h.connects == 1
        finally:
            await h.aclose()

    run(go)
    pinned = (tmp_path / "state" / "ssh" / "known_hosts").read_text().split()
    assert pinned[:2] == [f"[{sshd.address}]:{sshd.port}", "ssh-ed25519"]
    assert stat.S_IMODE((tmp_path / "state" / "ssh").stat().st_mode) == 0o700


def test_a_changed_host_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    async def first() -> None:
        h = host(sshd, tmp_path)
        await h.run("true")
        await h.aclose()

    run(first)
    sshd.restart_with_new_host_key()

    async def second() -> None:
        h = host(sshd, tmp_path)
        try:
            with pytest.raises(Refused) as info:
                await h.run("touch " + str(tmp_path / "reached"))
            assert info.value.code == Code.GUARD
            assert "changed" in str(info.value)
        finally:
            await h.aclose()

    run(second)
    assert not (tmp_path / "reached").exists()


def test_a_key_pinned_by_another_login_meanwhile_is_the_same_key_not_a_changed_one(tmp_path: Path) -> None:
    """Three controllers logging in to a new host at once: each began with nothing pinned, the first to
    succeed pins the host's key, and the others then see that very key (a suite run once failed one
    of them as "host key changed"). Another key is still refused."""
    import asyncssh

    from actor_run.protocols.hosts.host_keys import HostKeys, PinningClient

    keys = HostKeys(tmp_path / "known_hosts")
    host_key = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    late = PinningClient(keys, "10.0.0.7", 22)  # its handshake began before anything was pinned
    assert keys.pin("10.0.0.7", 22, host_key)  # another connection's login pinned it meanwhile
    assert late.validate_host_public_key("10.0.0.7", "10.0.0.7", 22, host_key)
    assert late.changed_to == ""
    assert late.seen is None  # nothing more to pin
    other = asyncssh.generate_private_key("ssh-ed25519").convert_to_public()
    assert not PinningClient(keys, "10.0.0.7", 22).validate_host_public_key("10.0.0.7", "10.0.0.7", 22, other)


def test_a_host_key_is_pinned_at_the_first_login_not_before(sshd: Sshd, tmp_path: Path) -> None:
    """A guest still booting may show a host key it replaces a moment later (its keys made on first
    boot, sshd restarted): a handshake whose login fails pins nothing, so the key the machine ends
    up with is the one held to."""
    from fakes.keys import client_key

    async def refused() -> None:
        h = SSHHost("test", sshd.address, port=sshd.port, user=sshd.user, connect_timeout_s=5,
                    key=str(client_key(tmp_path / "stranger")),  # not in authorized_keys
                    known_hosts=tmp_path / "state" / "ssh" / "known_hosts")
        try:
            with pytest.raises(Refused) as info:
                await h.run("true")
            assert info.value.code == Code.LAUNCH_FAILED
        finally:
            await h.aclose()

    run(refused)
    known = tmp_path / "state" / "ssh" / "known_hosts"
    assert not known.exists() or known.read_text() == ""
    sshd.restart_with_new_host_key()

    async def logs_in() -> None:
        h = host(sshd, tmp_path)
        try:
            assert (await h.run("echo in")).stdout == b"in\n"
        finally:
            await h.aclose()

    run(logs_in)
    pub = sshd.host_key.with_name(sshd.host_key.name + ".pub").read_text().split()
    assert known.read_text().split()[1:3] == pub[:2]


def test_a_cut_connection_is_replaced_on_the_next_call(sshd: Sshd, tmp_path: Path) -> None:
    h = host(sshd, tmp_path)

    async def call_after_cut() -> None:
        # the first call may learn of the cut (Unreachable); the one after it must succeed
        for _ in range(2):
            try:
                assert (await h.run("echo back")).stdout == b"back\n"
                return
            except Unreachable:
                continue
        raise AssertionError("no reconnection")

    async def go() -> None:
        try:
            await h.run("true")
            sshd.kill_sessions()
            await call_after_cut()
            assert h.connects == 2
            sshd.restart()
            await call_after_cut()
            assert h.connects == 3
            sshd.stop()
            with pytest.raises(Unreachable):
                await h.run("true")
            sshd.start()
            await call_after_cut()
        finally:
            await h.aclose()

    run(go)


# --- files -----------------------------------------------------------------------------------------


def make_tree(src: Path) -> None:
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "sub" / "run.sh").chmod(0o755)
    os.symlink("a.txt", src / "link")
    os.symlink("/etc/hostname", src / "outside")


@pytest.mark.parametrize("bulk", [False, True], ids=["asyncssh", "ssh-client"])
def test_put_and_get_tar_keep_links_as_links(sshd: Sshd, tmp_path: Path, bulk: bool) -> None:
    src, remote = tmp_path / "src", tmp_path / "remote" / "deep" / "tree"
    make_tree(src)
    (tmp_path / "big").write_bytes(os.urandom(3 << 20))
    h = host(sshd, tmp_path, bulk_bytes=0 if bulk else 1 << 62)

    async def go() -> None:
        try:
            assert await h.put(src, str(remote)) == 1 + len("#!/bin/sh\necho ran\n")
            assert await h.put(tmp_path / "big", str(tmp_path / "remote" / "new" / "big")) == 3 << 20
            with pytest.raises(Unreachable, match="already exists"):
                await h.put(tmp_path / "big", str(tmp_path / "remote" / "new" / "big"))
            names = ["a.txt", "link", "outside", "sub"]
            assert await h.get_tar(str(remote), names, tmp_path / "back.tar") > 0
        finally:
            await h.aclose()

    run(go)
    assert os.readlink(remote / "link") == "a.txt"
    assert os.readlink(remote / "outside") == "/etc/hostname"
    assert (remote / "sub" / "run.sh").stat().st_mode & stat.S_IXUSR
    assert (tmp_path / "remote" / "new" / "big").read_bytes() == (tmp_path / "big").read_bytes()
    with tarfile.open(tmp_path / "back.tar") as tar:
        kinds = {m.name: m.issym() for m in tar.getmembers()}
    assert kinds == {"a.txt": False, "link": True, "outside": True, "sub": False, "sub/run.sh": False}


def test_the_bulk_path_falls_back_when_the_ssh_client_fails(sshd: Sshd, tmp_path: Path) -> None:
    fake = tmp_path / "fake-ssh"
    fake.write_text("#!/bin/sh\necho 'ssh: cannot' >&2\nexit 255\n")
    fake.chmod(0o755)
    (tmp_path / "data").write_bytes(b"x" * 1000)
    h = host(sshd, tmp_path, bulk_bytes=0, ssh_client=str(fake))

    async def go() -> None:
        try:
            assert await h.put(tmp_path / "data", str(tmp_path / "remote" / "data")) == 1000
        finally:
            await h.aclose()

    run(go)
    assert (tmp_path / "remote" / "data").read_bytes() == b"x" * 1000


@pytest.mark.parametrize("bulk", [False, True], ids=["asyncssh", "ssh-client"])
def test_the_local_tar_runs_in_the_environment_of_now(sshd: Sshd, tmp_path: Path, bulk: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that runs one batch after another (an embedder, a test calling the CLI's main)
    may change its environment in between: the local tar sees it as it is when it runs, not as it
    was when this module was imported (issue 24)."""
    real = shutil.which("tar")
    assert real is not None
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    (wrappers / "tar").write_text(f'#!/bin/sh\necho "$TAR_MARK" >> "{tmp_path / "tar-ran"}"\nexec {real} "$@"\n')
    (wrappers / "tar").chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrappers}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TAR_MARK", "now")
    src = tmp_path / "src"
    make_tree(src)
    h = host(sshd, tmp_path, bulk_bytes=0 if bulk else 1 << 62)

    async def go() -> None:
        try:
            await h.put(src, str(tmp_path / "remote" / "tree"))
        finally:
            await h.aclose()

    run(go)
    assert (tmp_path / "tar-ran").read_text().split() == ["now"]
    assert (tmp_path / "remote" / "tree" / "a.txt").read_text() == "A"


def test_the_ssh_client_is_found_on_the_path_of_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenSSH client (bulk uploads, `actor-run ssh`) is looked for on PATH as a host is made,
    not once at import: a process's later runs see its PATH as it is then (issue 24)."""
    (tmp_path / "bin").mkdir()
    mine = tmp_path / "bin" / "ssh"
    mine.write_text("#!/bin/sh\nexit 255\n")
    mine.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    h = SSHHost("test", "127.0.0.1", known_hosts=tmp_path / "known_hosts")
    assert h.ssh_client == str(mine)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert SSHHost("test", "127.0.0.1", known_hosts=tmp_path / "known_hosts").ssh_client is None  # none: asyncssh


def workspace(sshd: Sshd, tmp_path: Path, **kwargs: Any) -> ShellWorkspace:
    return ShellWorkspace(host(sshd, tmp_path, **kwargs), str(tmp_path / "root"))


def test_fetch_never_brings_back_what_a_link_points_at(sshd: Sshd, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET")
    ws = workspace(sshd, tmp_path)

    async def go() -> None:
        try:
            await ws.prepare()
            work = Path(ws.work_dir("j", 0, 0))
            (work / "out" / "d").mkdir(parents=True)
            (work / "out" / "result.txt").write_text("ok")
            os.symlink(secret, work / "out" / "leak.txt")
            os.symlink(secret.parent, work / "out" / "d" / "up")
            (work / "response.json").write_text('{"exit_code": 0}')
            await ws.fetch(str(work), tmp_path / "back")
        finally:
            await ws.aclose()

    run(go)
    back = tmp_path / "back"
    assert (back / "out" / "result.txt").read_text() == "ok"
    assert not (back / "out" / "leak.txt").exists()
    assert not (back / "out" / "leak.txt").is_symlink()
    assert not (back / "out" / "d" / "up").exists()
    assert all("SECRET" not in p.read_text() for p in back.rglob("*") if p.is_file())


def test_a_fetched_tar_lands_only_what_was_asked_for(tmp_path: Path) -> None:
    """A fetch lands in the seed's folder, beside the controller's own log.txt and response.json:
    a tar with more in it than the names asked for (a machine's tar gone wrong) replaces neither."""
    src = tmp_path / "src"
    (src / "out" / "d").mkdir(parents=True)
    for rel, text in {"out/d/r.txt": "ok", "log.txt": "forged", "response.json": "forged",
                      "outside.txt": "forged", "progress.jsonl": "{}\n"}.items():
        (src / rel).write_text(text)
    tar_path = tmp_path / "t.tar"
    with tarfile.open(tar_path, "w") as tar:
        for rel in ("out", "log.txt", "response.json", "outside.txt", "progress.jsonl"):
            tar.add(src / rel, arcname=rel)
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "log.txt").write_text("ours\n")
    _extract(tar_path, seed, ["out", "progress.jsonl"])
    assert (seed / "out" / "d" / "r.txt").read_text() == "ok"
    assert (seed / "progress.jsonl").read_text() == "{}\n"
    assert (seed / "log.txt").read_text() == "ours\n"
    assert not (seed / "response.json").exists()
    assert not (seed / "outside.txt").exists()


def test_publishing_twice_sends_nothing_the_second_time(sshd: Sshd, tmp_path: Path) -> None:
    code = tmp_path / "code"
    make_tree(code)
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(100_000))
    ws = workspace(sshd, tmp_path)

    async def go() -> None:
        try:
            await ws.prepare()
            digest = snapshot_code(code, tmp_path / "snap")
            assert await ws.publish_code(tmp_path / "snap", digest, "t1") > 0
            assert await ws.publish_code(tmp_path / "snap", digest, "t2") == 0
            sha = file_sha256(data)
            assert await ws.publish_input("data", data, sha, "t1") == 100_000
            assert await ws.publish_input("data", data, sha, "t2") == 0
            assert ws.bytes_sent == 100_000 + 1 + len("#!/bin/sh\necho ran\n")
        finally:
            await ws.aclose()

    run(go)
    root = tmp_path / "root"
    assert (root / "objects" / file_sha256(data) / "data").read_bytes() == data.read_bytes()
    assert incoming_left(root) == []


def test_two_workspaces_publish_one_input_at_once(sshd: Sshd, tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(2 << 20))
    sha = file_sha256(data)
    spaces = [workspace(sshd, tmp_path), workspace(sshd, tmp_path)]
    sent: list[int] = []

    async def publish(ws: ShellWorkspace, tag: str) -> None:
        sent.append(await ws.publish_input("data", data, sha, tag))

    async def go() -> None:
        try:
            for ws in spaces:
                await ws.prepare()
            async with trio.open_nursery() as nursery:
                for i, ws in enumerate(spaces):
                    nursery.start_soon(publish, ws, f"a{i}")
        finally:
            for ws in spaces:
                await ws.aclose()

    run(go)
    root = tmp_path / "root"
    assert (root / "objects" / sha / "data").read_bytes() == data.read_bytes()
    assert (root / "objects" / sha / ".complete").exists()
    assert sorted(os.listdir(root / "objects")) == [sha]
    assert incoming_left(root) == []
    assert 2 << 20 in sent


def test_an_input_changed_after_hashing_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"before")
    sha = file_sha256(data)
    data.write_bytes(b"after!")
    ws = workspace(sshd, tmp_path)

    async def go() -> None:
        try:
            await ws.prepare()
            with pytest.raises(Refused) as info:
                await ws.publish_input("data", data, sha, "t1")
            assert info.value.code == Code.INPUT
        finally:
            await ws.aclose()

    run(go)
    root = tmp_path / "root"
    assert incoming_left(root) == []
    assert not (root / "objects" / sha).exists()


def test_a_root_others_can_write_is_refused_and_left_untouched(sshd: Sshd, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o777)
    ws = workspace(sshd, tmp_path)

    async def go() -> None:
        try:
            with pytest.raises(Refused) as info:
                await ws.prepare()
            assert info.value.code == Code.GUARD
            assert "writable" in str(info.value)
        finally:
            await ws.aclose()

    run(go)
    assert list(root.iterdir()) == []


def test_the_watchdog_stops_a_job_its_controller_lost(sshd: Sshd, tmp_path: Path) -> None:
    lost_after_s = 2.0
    ws = workspace(sshd, tmp_path)

    async def go() -> tuple[float, float]:
        try:
            await ws.prepare()
            work = ws.work_dir("j", 0, 0)
            pid = await ws.start(Launch(
                work=work, command="sleep 60", code=None, inputs=[], env={}, lost_after_s=lost_after_s,
            ))
            assert psutil.pid_exists(pid)
            started = trio.current_time()
            lost = int(lost_after_s + min(60.0, lost_after_s))
            every = max(1, min(30, lost // 4))
            bound = lost + 3 * every + 5.0  # + margin: the watchdog's TERM grace, a slow machine
            while trio.current_time() - started < bound:  # waiting on an external process
                if not psutil.pid_exists(pid) and not await trio.Path(work).exists():
                    took = trio.current_time() - started
                    # its tombstone still tells a sweep that the controller went silent, and how long ago
                    beat = await ws.last_beat()
                    assert beat is not None
                    assert beat.lost_after_s == lost_after_s
                    assert beat.age_s > lost_after_s
                    return took, bound
                await trio.sleep(0.2)
            raise AssertionError(f"job {pid} or {work} still there after {bound} s")
        finally:
            await ws.aclose()

    took, bound = run(go)
    assert lost_after_s < took < bound


# --- the ssh cloud ---------------------------------------------------------------------------------


def cloud(sshd: Sshd, tmp_path: Path, slots: int = 1) -> SSHCloud:
    settings = SSHSettings(hosts={
        "gpu1": SSHHostSettings(
            address=sshd.address, port=sshd.port, user=sshd.user, key=str(sshd.user_key),
            root=str(tmp_path / "root"), slots=slots, connect_timeout_s=5,
        ),
    })
    return SSHCloud(settings, tmp_path / "state")


def test_settings_come_from_the_batch_table() -> None:
    raw = {"hosts": {"gpu1": {"address": "10.0.0.7", "port": 22, "user": "ubuntu", "key": "~/.ssh/id_ed25519",
                              "root": "~/.actor-run", "slots": 1}}}
    settings = parse_settings("ssh", raw)
    assert settings == SSHSettings(hosts={"gpu1": SSHHostSettings(
        address="10.0.0.7", user="ubuntu", key="~/.ssh/id_ed25519",
    )})
    with pytest.raises(SpecError) as info:
        parse_settings("ssh", {"hosts": {"gpu1": {"address": "h", "lost_after_s": 5}}})
    assert "lost_after_s" in str(info.value)
    with pytest.raises(SpecError):
        parse_settings("ssh", {"hosts": {"gpu1": {"address": "h", "slots": 0}}})


def test_offers_walk_the_named_hosts(tmp_path: Path) -> None:
    hosts = {"a": SSHHostSettings(address="10.0.0.1"), "b": SSHHostSettings(address="10.0.0.2")}
    c = SSHCloud(SSHSettings(hosts=hosts), tmp_path)

    async def go() -> None:
        offers = await c.offers(CandidateSpec(cloud="ssh", hosts=["b", "a"]), 3)
        got = [(o.host, o.region, o.candidate, o.hourly_usd) for o in offers]
        assert got == [("b", "b", 3, 0.0), ("a", "a", 3, 0.0)]
        assert [o.host for o in await c.offers(CandidateSpec(cloud="ssh"), 0)] == ["a", "b"]
        with pytest.raises(SpecError) as info:
            await c.offers(CandidateSpec(cloud="ssh", hosts=["a", "x"]), 1)
        assert info.value.field == "candidates[1].hosts"
        assert "unknown host 'x'" in str(info.value)

    run(go)


def test_slots_are_claimed_listed_and_freed(sshd: Sshd, tmp_path: Path) -> None:
    c = cloud(sshd, tmp_path)
    first = encode_name("train", 1, 0, "deadbeef", 2e9)
    second = encode_name("train", 2, 0, "deadbeef", 2e9)
    offer = Offer(cloud="ssh", host="gpu1", region="gpu1")
    root = tmp_path / "root"

    async def go() -> None:
        try:
            m1 = await c.launch(offer, first, 2e9)
            assert (m1.id, m1.region, m1.root) == ("gpu1/0", "gpu1", str(root))
            assert (await c.launch(offer, first, 2e9)).id == "gpu1/0"  # a retried launch: the same slot
            with pytest.raises(LaunchRefused) as info:
                await c.launch(offer, second, 2e9)
            assert info.value.code == Code.NO_CAPACITY
            assert [(m.name, m.id, m.deadline) for m in await c.list_ours("ar-")] == [(first, "gpu1/0", 2e9)]
            assert await c.list_ours("ar-other-") == []

            ws = await c.connect(m1)
            data = tmp_path / "data.bin"
            data.write_bytes(b"shared")
            await ws.publish_input("data", data, file_sha256(data), "t1")
            work = ws.work_dir("train", 1, 0)
            assert work.startswith(f"{root}/work/{first}/")
            launch = Launch(work=work, command="sleep 60", code=None, inputs=[], env={}, lost_after_s=60)
            pid = await ws.start(launch)
            # someone else's files on the same host
            (root / "work" / "not-ours").mkdir(parents=True)

            watchdog = int((Path(work) / "watchdog.pid").read_text())
            await c.delete(first, m1.id)
            assert sessions_alive({pid, watchdog}) == []  # the job, the watchdog and its `sleep`
            assert not (root / "work" / first).exists()
            assert (root / "work" / "not-ours").exists()
            assert (root / "objects" / file_sha256(data)).exists()
            assert await c.list_ours("ar-") == []
            await c.delete(first, m1.id)  # idempotent
            await c.delete(first)  # by name alone, as a sweep does

            m2 = await c.launch(offer, second, 2e9)
            assert m2.id == "gpu1/0"
            sshd.stop()
            with pytest.raises(DeleteUnconfirmed):
                await c.delete(second, m2.id)
            assert await c.list_ours("ar-") == []  # an unreachable host is skipped
            sshd.start()
            await c.delete(second, m2.id)
            assert sorted(os.listdir(root / "slots")) == []
        finally:
            await c.aclose()

    run(go)


def test_two_controllers_never_take_one_slot(sshd: Sshd, tmp_path: Path) -> None:
    clouds = [cloud(sshd, tmp_path, slots=2) for _ in range(3)]  # one connection each, as controllers
    offer = Offer(cloud="ssh", host="gpu1", region="gpu1")
    names = [encode_name("t", i, 0, "deadbeef", 2e9) for i in range(3)]
    ids: list[str] = []

    async def take(c: SSHCloud, name: str) -> None:
        try:
            ids.append((await c.launch(offer, name, 2e9)).id)
        except LaunchRefused as exc:
            ids.append(exc.code)

    async def go() -> None:
        try:
            async with trio.open_nursery() as nursery:
                for c, name in zip(clouds, names, strict=True):
                    nursery.start_soon(take, c, name)
            assert sorted(ids) == ["gpu1/0", "gpu1/1", Code.NO_CAPACITY]
            assert sorted(m.id for m in await clouds[0].list_ours("ar-")) == ["gpu1/0", "gpu1/1"]
            for name in names:
                await clouds[0].delete(name)
        finally:
            for c in clouds:
                await c.aclose()

    run(go)
    assert os.listdir(tmp_path / "root" / "slots") == []


def test_a_bad_root_refuses_the_launch(sshd: Sshd, tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root").chmod(0o777)
    c = cloud(sshd, tmp_path)

    async def go() -> None:
        try:
            with pytest.raises(LaunchRefused) as info:
                await c.launch(Offer(cloud="ssh", host="gpu1"), encode_name("t", 0, 0, "deadbeef", 2e9), 2e9)
            assert info.value.code == Code.GUARD
        finally:
            await c.aclose()

    run(go)
    assert list((tmp_path / "root").iterdir()) == []
